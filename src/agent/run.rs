//! The loop: model turn → tool calls (validated, run concurrently, results in call order) →
//! next turn, until a final answer, a limit, a model error or an abort.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;

use futures::stream::{self, StreamExt};
use futures::FutureExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::forge::{RejectionCategory, FORGE_TOOL_NAME};
use crate::model::{
    finish_kind, CallInfo, ChunkSink, Message, Model, ModelChunk, ModelError, ModelRequest, ResponseAssembler, ResponseFormat, ToolCall, ToolChoice,
    ToolDefinition,
};
use crate::store::{BatchOp, Store, Versioned};
use crate::tools::{execute_call, takes_unparsed, CallContext, CompiledSchema, ExecutionLimits, RunSignal, ToolFailure, ToolOutcome, ToolSet};

use super::approval::{ApprovalDecision, CallDecision, PendingApproval, PendingStep, TOOL_CALL_APPROVAL};

use super::config::AgentConfig;
use super::env::{unless_cancelled, CancelSignal, Environment};
use super::error::AgentError;
use super::events::{AgentEvent, EventBody, EventSink};
use super::late_saves::{LateSaves, SaveWrite};
use super::structured::{check_final_answer, is_whole_json, returns_instruction, returns_reminder, OutputCheck, OutputRefusal, ANSWER_CUT_OFF};
use super::usage::{RunUsage, UsageRecorder};

/// The loop's state: plain data, serializable, no I/O (so a run can be persisted and resumed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunState {
    pub run_id: String,
    pub run_path: Vec<String>,
    pub session_id: String,
    /// Conversation so far, without the system message (rebuilt from config each turn).
    pub messages: Vec<Message>,
    /// Model turns taken.
    pub turns: u32,
    /// Tool calls dispatched.
    pub steps: u32,
    /// Re-prompts spent on invalid structured answers.
    pub output_retries: u32,
    pub usage: RunUsage,
    /// The step a paused run waits in (calls awaiting approval); `None` between steps.
    #[serde(default)]
    pub pending: Option<PendingStep>,
    /// How many of `messages` are the session's conversation from before the run; the rest
    /// are the run's own, which are all a completed run adds to the session (after what other
    /// runs of the session added meanwhile). `None` in states saved before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_len: Option<u32>,
    /// How many of the session's messages had been dropped (`sessionHistory`) when the run
    /// started: `messages[0]` was the session's message at this position. `None` in states
    /// saved before it was recorded (read as 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_offset: Option<u64>,
    /// The agent instance that counted `history_offset` (a new one in each process): a run
    /// resumed by another (after a restart) is not placed in its session by that offset.
    /// `None` in states saved before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_epoch: Option<String>,
    /// The scope label the run's forge attempts are tagged with ([`super::RunOptions::scope`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

impl RunState {
    /// A copy without its messages (the session's whole conversation, perhaps): for a record
    /// that stores them apart.
    fn clone_without_messages(&self) -> RunState {
        RunState {
            run_id: self.run_id.clone(),
            run_path: self.run_path.clone(),
            session_id: self.session_id.clone(),
            messages: vec![],
            turns: self.turns,
            steps: self.steps,
            output_retries: self.output_retries,
            usage: self.usage.clone(),
            pending: self.pending.clone(),
            history_len: self.history_len,
            history_offset: self.history_offset,
            history_epoch: self.history_epoch.clone(),
            scope: self.scope.clone(),
        }
    }
}

/// A run whose state is stored (see [`crate::agent::Agent::stored_runs`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "wasm-core", derive(tsify::Tsify))]
#[serde(rename_all = "camelCase")]
pub struct StoredRun {
    pub run_id: String,
    pub session_id: String,
    pub status: StoredRunStatus,
    pub turns: u32,
    pub steps: u32,
    /// What a paused run waits for (empty for an interrupted one).
    pub pending_approvals: Vec<PendingApproval>,
}

/// Where a stored run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "wasm-core", derive(tsify::Tsify))]
#[serde(rename_all = "lowercase")]
pub enum StoredRunStatus {
    /// Its calls wait for approval.
    Paused,
    /// It stopped between steps: a model failure, a failed save, an abort (not told apart: the
    /// store does not record why a run stopped), a process that ended.
    Interrupted,
    /// A run or resume of it is going: its state is the last step saved. Known for one going in
    /// this context (this page, worker or process) and, when the store can tell whether a lock
    /// is held ([`crate::store::Store::lock_held`]; IndexedDB with Web Locks), for one going in
    /// another tab or worker; elsewhere such a run shows its saved status (`interrupted` or
    /// `paused`), and a resume of it waits for that run to end.
    Running,
}

impl StoredRun {
    /// `running`: whether a run or resume of it is going now.
    pub(crate) fn of(state: RunState, running: bool) -> Self {
        let pending_approvals = state.pending.map(|p| p.approvals).unwrap_or_default();
        let status = if running {
            StoredRunStatus::Running
        } else if pending_approvals.is_empty() {
            StoredRunStatus::Interrupted
        } else {
            StoredRunStatus::Paused
        };
        Self { run_id: state.run_id, session_id: state.session_id, status, turns: state.turns, steps: state.steps, pending_approvals }
    }
}

/// How a run call ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// A final answer.
    Completed,
    /// Waiting for approvals; continue with `resume`.
    Paused,
}

/// A finished run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunOutput {
    pub run_id: String,
    pub status: RunStatus,
    /// The parsed answer when `returns` is set, else the text as a JSON string.
    pub output: Value,
    pub text: String,
    pub usage: RunUsage,
    pub turns: u32,
    pub steps: u32,
    /// The conversation including this run (without the system message).
    pub messages: Vec<Message>,
    /// Why the last answer ended ([`crate::model::finish_kind`]); `tool_calls` when paused.
    pub finish_reason: String,
    /// Calls waiting for a decision (paused runs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_approvals: Vec<PendingApproval>,
    /// The run's state (paused runs): plain JSON, also persisted when the agent has a store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<RunState>,
}

impl RunOutput {
    fn paused(state: &RunState) -> Self {
        Self {
            run_id: state.run_id.clone(),
            status: RunStatus::Paused,
            output: Value::Null,
            text: String::new(),
            usage: state.usage.clone(),
            turns: state.turns,
            steps: state.steps,
            messages: state.messages.clone(),
            finish_reason: "tool_calls".into(),
            pending_approvals: state.pending.as_ref().map(|p| p.approvals.clone()).unwrap_or_default(),
            state: Some(state.clone()),
        }
    }
}

/// Everything one run needs, borrowed from the agent.
pub(crate) struct RunContext<'a> {
    pub config: &'a AgentConfig,
    pub returns: Option<&'a CompiledSchema>,
    /// The host's check of answers `returns` accepted.
    pub output_check: Option<&'a dyn OutputCheck>,
    pub model: &'a dyn Model,
    pub tools: &'a ToolSet,
    /// When set, asked for the tool set before every turn.
    pub provider: Option<&'a dyn super::ToolProvider>,
    pub env: &'a dyn Environment,
    pub cancel: Option<&'a Rc<dyn CancelSignal>>,
    /// Where run states are persisted at step boundaries (`None`: not persisted).
    pub runs: Option<RunRecorder>,
    /// Decisions for the pending step of a resumed run.
    pub decisions: &'a [ApprovalDecision],
}

/// Persists run states under `<prefix><runId>` as versioned records, and the conversation a
/// run started from (its session's, the same at every step) once, under
/// `<history_prefix><runId>`: saved with every step, it made a ten-step run in a session of
/// 4 MiB write 44 MiB.
pub(crate) struct RunRecorder {
    pub store: Rc<dyn Store>,
    pub prefix: String,
    pub history_prefix: String,
    /// Where a save an abort left unsettled is kept for the next read of its run.
    pub late: Rc<LateSaves>,
    /// Whether this context's saves of the run include its starting conversation no more: set
    /// as the first save is built, which writes it with the state in one batch (a save that
    /// fails ends the run's drive, and the next drive has a recorder of its own).
    history_written: Cell<bool>,
}

/// Schema version of persisted run states: 2 when the conversation the run started from is
/// stored apart (`historyApart`), which a build reading version 1 only would resume without.
pub(crate) const RUN_STATE_VERSION: u32 = 2;

/// The version of a state stored whole, which builds before version 2 read too.
const WHOLE_RUN_STATE_VERSION: u32 = 1;

/// A stored run-state record as a [`RunState`]: one of another kind, or of a newer version, is
/// `InvalidState`. Of a record whose starting conversation is stored apart, `messages` holds
/// only the run's own (see [`Agent::load_run`](super::Agent::load_run) for the whole state).
pub(crate) fn read_run_state(value: Value) -> Result<RunState, AgentError> {
    let record: Versioned<RunState> = serde_json::from_value(value).map_err(|e| AgentError::InvalidState(e.to_string()))?;
    if record.kind != "run" || record.v > RUN_STATE_VERSION {
        return Err(AgentError::InvalidState(format!("record kind `{}` version {} is not a run state this build reads", record.kind, record.v)));
    }
    Ok(record.data)
}

impl RunRecorder {
    pub(crate) fn new(store: Rc<dyn Store>, agent_prefix: &str, late: Rc<LateSaves>) -> Self {
        Self { store, prefix: format!("{agent_prefix}run/"), history_prefix: format!("{agent_prefix}run-history/"), late, history_written: Cell::new(false) }
    }

    pub(crate) fn key(&self, run_id: &str) -> String {
        format!("{}{run_id}", self.prefix)
    }

    fn history_key(&self, run_id: &str) -> String {
        format!("{}{run_id}", self.history_prefix)
    }

    /// The write of `state`, not started: shared, so that the next read of the run can wait
    /// for it when an abort leaves it unsettled. The conversation the run started from goes
    /// apart, written with the first save only.
    fn save(&self, state: &RunState) -> Result<SaveWrite, AgentError> {
        let invalid = |e: serde_json::Error| AgentError::InvalidState(e.to_string());
        // Messages only grow within a drive, so the split stays where the first save put it. A
        // record claiming more history than it has messages is saved whole, as before.
        let start = match state.history_len {
            Some(len) if len as usize <= state.messages.len() => len as usize,
            _ => 0,
        };
        let store = self.store.clone();
        if start == 0 {
            let value = serde_json::to_value(Versioned { kind: "run".to_string(), v: WHOLE_RUN_STATE_VERSION, data: state }).map_err(invalid)?;
            let key = self.key(&state.run_id);
            return Ok(async move { store.put(&key, value).await }.boxed_local().shared());
        }
        let own = RunState { messages: state.messages[start..].to_vec(), ..state.clone_without_messages() };
        let mut value = serde_json::to_value(Versioned { kind: "run".to_string(), v: RUN_STATE_VERSION, data: &own }).map_err(invalid)?;
        value["data"]["historyApart"] = Value::Bool(true);
        let mut ops = vec![];
        if !self.history_written.replace(true) {
            let history = serde_json::to_value(Versioned { kind: "run-history".to_string(), v: 1, data: &state.messages[..start] }).map_err(invalid)?;
            ops.push(BatchOp::Put { key: self.history_key(&state.run_id), value: history });
        }
        ops.push(BatchOp::Put { key: self.key(&state.run_id), value });
        Ok(async move { store.batch(ops).await }.boxed_local().shared())
    }

    /// Every key of `run_id`'s records, its starting conversation's first: a delete of both
    /// that a store tears leaves the state, which is listed and can be discarded again, not a
    /// conversation nothing lists.
    pub(crate) fn keys(&self, run_id: &str) -> [String; 2] {
        [self.history_key(run_id), self.key(run_id)]
    }

    pub(crate) async fn forget(&self, run_id: &str) -> Result<(), AgentError> {
        let ops = self.keys(run_id).into_iter().map(|key| BatchOp::Delete { key }).collect();
        self.store.batch(ops).await.map_err(AgentError::Store)
    }

    /// The stored record of `run_id` as the whole state: the conversation it started from put
    /// back in front of its own when stored apart. `None` when there is none.
    pub(crate) async fn load(&self, run_id: &str) -> Result<Option<RunState>, AgentError> {
        let Some(mut value) = self.store.get(&self.key(run_id)).await.map_err(AgentError::Store)? else { return Ok(None) };
        if value["data"]["historyApart"] == Value::Bool(true) {
            let history = self.store.get(&self.history_key(run_id)).await.map_err(AgentError::Store)?;
            let Some(Value::Array(mut messages)) = history.filter(|h| h["kind"] == "run-history" && h["v"] == 1).map(|mut h| h["data"].take()) else {
                return Err(AgentError::InvalidState(format!("run `{run_id}`: the conversation it started from is missing from the store")));
            };
            if let Some(Value::Array(own)) = value["data"].get_mut("messages").map(Value::take) {
                messages.extend(own);
            }
            value["data"]["messages"] = Value::Array(messages);
            // Written again with the next save: this context has not written it.
        }
        read_run_state(value).map(Some)
    }
}

struct Emitter<'s> {
    sink: RefCell<&'s mut dyn EventSink>,
    run_id: String,
    run_path: Vec<String>,
}

impl Emitter<'_> {
    fn emit(&self, body: EventBody) {
        let event = AgentEvent { run_id: self.run_id.clone(), run_path: self.run_path.clone(), body };
        self.sink.borrow_mut().emit(event);
    }
}

struct TextForwarder<'e, 's> {
    emitter: &'e Emitter<'s>,
    assembler: ResponseAssembler,
    step: u32,
}

impl ChunkSink for TextForwarder<'_, '_> {
    fn chunk(&mut self, chunk: &ModelChunk) {
        self.assembler.push(chunk);
        // Text past the response's bound is not forwarded either.
        if let ModelChunk::Text { delta } = chunk {
            if !delta.is_empty() && !self.assembler.overflowed() {
                self.emitter.emit(EventBody::TextDelta { step: self.step, delta: delta.clone() });
            }
        }
    }

    fn stopped(&self) -> bool {
        self.assembler.overflowed()
    }
}

impl RunContext<'_> {
    fn system_prompt(&self) -> Option<Message> {
        let mut prompt = self.config.instructions.clone();
        if let Some(schema) = &self.config.returns {
            if !prompt.is_empty() {
                prompt.push_str("\n\n");
            }
            prompt.push_str(&returns_instruction(schema));
        }
        (!prompt.is_empty()).then_some(Message::System { content: prompt })
    }

    /// The answer in `text` that `schema` accepts and the host's check (if any) lets through;
    /// the reason to ask again when there is none.
    async fn check_answer(&self, text: &str, schema: &CompiledSchema, run_id: &str) -> Result<Value, OutputRefusal> {
        let value = check_final_answer(text, schema).map_err(OutputRefusal::Refused)?;
        match self.output_check {
            Some(check) => check.check(&value, run_id).await.map(|()| value),
            None => Ok(value),
        }
    }

    /// The answer format of a turn: the `returns` schema when the turn offers no tools, so its
    /// answer can only be the final one and providers that constrain decoding produce a
    /// matching answer the first time instead of after re-prompts. A turn with tools gets
    /// none: a schema-constrained answer cannot be a tool call (given both, llama.cpp's server
    /// answers in the schema and never calls). Neither does a schema whose root is not an
    /// object (OpenAI-compatible structured output wants one); the prompt and the check hold
    /// for all. A root that is a local `$ref` to an object (Zod's `.meta({ id })`) is sent as
    /// that object, its definitions beside it.
    fn response_format(&self, tools: &[ToolDefinition]) -> Option<ResponseFormat> {
        let returns = self.returns.filter(|_| tools.is_empty())?;
        let schema = if is_object_schema(returns.source()) { returns.shared_source() } else { std::rc::Rc::new(referenced_root(returns.source())?) };
        Some(ResponseFormat::JsonSchema { name: "answer".into(), schema })
    }

    /// The tool choice of a turn: the configured one until the run's first tool call (unless
    /// `resetToolChoice` is off). A choice that needs a tool on a turn without tools (an agent
    /// with none), or a named tool this turn does not offer, ends the run with
    /// `invalid_config`: the model could not obey it, and silently answering without the
    /// required call would hide the misconfiguration.
    fn tool_choice(&self, calls_so_far: u32, tools: &ToolSet) -> Result<Option<ToolChoice>, AgentError> {
        let Some(choice) = &self.config.tool_choice else { return Ok(None) };
        if self.config.reset_tool_choice && calls_so_far > 0 {
            return Ok(None);
        }
        if tools.is_empty() {
            return match choice {
                ToolChoice::Required | ToolChoice::Tool(_) => {
                    Err(AgentError::InvalidConfig("toolChoice asks for a tool call, but this agent has no tools to call".into()))
                }
                _ => Ok(None),
            };
        }
        if let ToolChoice::Tool(name) = choice {
            if !tools.contains(name) {
                return Err(AgentError::InvalidConfig(format!("toolChoice names `{name}`, which is not among this turn's tools")));
            }
        }
        Ok(Some(choice.clone()))
    }

    fn cancelled(&self) -> bool {
        self.cancel.is_some_and(|c| c.is_cancelled())
    }

    /// `work`, unless the run is cancelled first: then it is abandoned (dropped) and the run
    /// ends `aborted` at once.
    async fn unless_cancelled<T>(&self, work: impl Future<Output = T>) -> Result<T, AgentError> {
        unless_cancelled(self.cancel.map(|c| &**c), work).await.ok_or(AgentError::Aborted)
    }

    /// Runs from `state` to the end. Emits `agent.end` or `agent.error` last.
    pub(crate) async fn drive(&self, mut state: RunState, sink: &mut dyn EventSink) -> (RunState, Result<RunOutput, AgentError>) {
        let emitter = Emitter { sink: RefCell::new(sink), run_id: state.run_id.clone(), run_path: state.run_path.clone() };
        let mut result = self.turns(&mut state, &emitter).await;
        if let Some(runs) = &self.runs {
            if run_ended(&result) {
                // Raced against the abort like every save: a store that never settles must not
                // hold a finished run, nor the `close()` waiting for it.
                if let Err(e) = self.unless_cancelled(runs.forget(&state.run_id)).await.and_then(|forgot| forgot) {
                    if result.is_ok() {
                        result = Err(e);
                    }
                }
            }
        }
        match &result {
            Ok(out) if out.status == RunStatus::Paused => emitter.emit(EventBody::AgentPaused {
                approvals: out.pending_approvals.clone(),
                usage: out.usage.clone(),
                state: serde_json::to_value(&state).unwrap_or(Value::Null),
            }),
            Ok(out) => emitter.emit(EventBody::AgentEnd {
                output: out.output.clone(),
                text: out.text.clone(),
                usage: out.usage.clone(),
                turns: out.turns,
                steps: out.steps,
                finish_reason: out.finish_reason.clone(),
            }),
            Err(e) => emitter.emit(EventBody::AgentError { error: e.info(), usage: state.usage.clone() }),
        }
        (state, result)
    }

    async fn turns(&self, state: &mut RunState, emitter: &Emitter<'_>) -> Result<RunOutput, AgentError> {
        let model_id = self.model.id();
        if state.turns == 0 && state.pending.is_none() {
            // Saved before the first model call, so a run that fails on the model or is
            // aborted in its first turn is resumable like one that fails later.
            self.save(state).await?;
        }
        if let Some(pending) = state.pending.clone() {
            // A step paused on the run's last turn (saved by an earlier build, or `maxTurns`
            // lowered since): its calls' results could not reach the model either.
            self.turn_left_for(state.turns, pending.calls.len())?;
            let decisions = pending.resolve(self.decisions).map_err(AgentError::InvalidResume)?;
            let provided = self.provider.map(|p| p.tools(&state.session_id, self.tools));
            let step_tools = provided.as_ref().unwrap_or(self.tools);
            // The approved calls are not abandoned on a cancel, unlike other calls: a human
            // approved them, and their results must be saved, or resuming the paused state again
            // would run them twice. The step's other calls are abandoned as any are (recorded as
            // aborted); the cancel takes effect once the approved ones end.
            let spent = UsageRecorder::default();
            let results = self
                .execute_calls(
                    StepCalls { step: pending.step, calls: &pending.calls, finish_reason: &pending.finish_reason },
                    state,
                    step_tools,
                    Some(&decisions),
                    &spent,
                    emitter,
                )
                .await;
            state.usage.merge(spent.take());
            state.messages.extend(results);
            state.pending = None;
            emitter.emit(EventBody::StepEnd {
                step: pending.step,
                finish_reason: pending.finish_reason,
                usage: pending.usage,
                tool_calls: pending.calls.len() as u32,
            });
            self.save(state).await?;
        }
        loop {
            if self.cancelled() {
                return Err(AgentError::Aborted);
            }
            self.turn_left_for(state.turns, 0)?;
            let step = state.turns;
            state.turns += 1;
            emitter.emit(EventBody::StepStart { step });

            let provided = self.provider.map(|p| p.tools(&state.session_id, self.tools));
            let turn_tools = provided.as_ref().unwrap_or(self.tools);
            let mut messages = Vec::with_capacity(state.messages.len() + 1);
            messages.extend(self.system_prompt());
            messages.extend(state.messages.iter().cloned());
            let tool_choice = self.tool_choice(state.steps, turn_tools)?;
            let tools = turn_tools.definitions();
            let response_format = self.response_format(&tools);
            let request =
                ModelRequest { messages, tools, temperature: self.config.temperature, max_tokens: self.config.max_tokens, response_format, tool_choice };
            let mut forwarder = TextForwarder { emitter, assembler: ResponseAssembler::new(), step };
            // Abandoned on an abort, like tool calls: a provider of the host's own may ignore
            // the signal and stream on (or never end). One that stops early instead, ending
            // quietly or with its own error (a fetch's `AbortError` read as a protocol failure),
            // leaves a partial answer the run must not take: it was aborted all the same.
            let streamed = self.unless_cancelled(self.model.stream(&request, &CallInfo { run_id: state.run_id.clone() }, &mut forwarder)).await?;
            if self.cancelled() {
                return Err(AgentError::Aborted);
            }
            // An `aborted` failure of a run nobody aborted is the provider's own (a timeout of
            // its own making, say): a model failure, not the run's abort.
            streamed.map_err(|e| {
                if !e.is_abort() {
                    return AgentError::from(e);
                }
                AgentError::Model(ModelError::from_provider(None, format!("the provider stopped as aborted, but the run was not: {}", e.message), e.status))
            })?;
            let response = forwarder.assembler.finish(&format!("{}-t{step}", state.run_id))?;
            let usage = response.usage.unwrap_or_default();
            state.usage.record(&model_id, usage);
            let finish_reason = response.finish_reason.clone().unwrap_or_else(|| "stop".into());

            if response.tool_calls.is_empty() {
                state.messages.push(Message::Assistant { content: response.text.clone(), tool_calls: vec![] });
                // A provider that says it stopped for tool calls and sent none (a server bug, or
                // calls it failed to write) ended no other way we know: `tool_calls` is the
                // paused run's reason, and a completed run never gives it.
                let answer_ended = match finish_kind(&finish_reason) {
                    "tool_calls" => "other",
                    kind => kind,
                };
                emitter.emit(EventBody::StepEnd { step, finish_reason, usage, tool_calls: 0 });
                let output = match self.returns {
                    None => Value::String(response.text.clone()),
                    // The host's check may wait (an async refinement): an abort ends the run
                    // meanwhile, and one that lands as the check finishes still wins.
                    Some(schema) => match if answer_ended == "length" && !is_whole_json(&response.text) {
                        Err(OutputRefusal::Refused(ANSWER_CUT_OFF.to_string()))
                    } else {
                        self.unless_cancelled(self.check_answer(&response.text, schema, &state.run_id)).await?
                    } {
                        _ if self.cancelled() => return Err(AgentError::Aborted),
                        Ok(value) => value,
                        Err(OutputRefusal::Failed(message)) => return Err(AgentError::OutputCheck(message)),
                        Err(OutputRefusal::Refused(reason)) => {
                            // A filtered answer would be filtered again: asking again only costs.
                            if answer_ended == "content_filter" {
                                let reason = format!("{reason} (the provider filtered the answer: finish reason `content_filter`)");
                                return Err(AgentError::StructuredOutputInvalid { attempts: state.output_retries + 1, reason });
                            }
                            // With no turn left a retry could not happen: the answer's fault is the error.
                            if state.output_retries >= self.config.max_output_retries || state.turns >= self.config.max_turns {
                                return Err(AgentError::StructuredOutputInvalid { attempts: state.output_retries + 1, reason });
                            }
                            state.output_retries += 1;
                            emitter.emit(EventBody::OutputRetry { step, reason: reason.clone() });
                            state.messages.push(Message::User { content: returns_reminder(&reason) });
                            continue;
                        }
                    },
                };
                return Ok(RunOutput {
                    run_id: state.run_id.clone(),
                    status: RunStatus::Completed,
                    pending_approvals: vec![],
                    state: None,
                    output,
                    text: response.text,
                    usage: state.usage.clone(),
                    turns: state.turns,
                    steps: state.steps,
                    messages: state.messages.clone(),
                    finish_reason: answer_ended.into(),
                });
            }

            let calls = response.tool_calls;
            if state.steps + calls.len() as u32 > self.config.max_steps {
                return Err(AgentError::MaxStepsExceeded { max: self.config.max_steps, ran: state.steps, calls_not_run: calls.len() as u32 });
            }
            // No turn is left to give the model these calls' results: running them would only
            // do their side effects (a refund would refund) for a run that fails anyway, so
            // they are neither run nor put to a human for approval.
            self.turn_left_for(state.turns, calls.len())?;
            state.steps += calls.len() as u32;
            state.messages.push(Message::Assistant { content: response.text, tool_calls: calls.clone() });
            for call in &calls {
                // As the tool gets them: text it takes unparsed is not parsed for the event either.
                let arguments = match turn_tools.get(&call.name).is_some_and(|tool| takes_unparsed(tool, &call.arguments)) {
                    true => Value::String(call.arguments.clone()),
                    false => serde_json::from_str(&call.arguments).unwrap_or_else(|_| Value::String(call.arguments.clone())),
                };
                emitter.emit(EventBody::ToolCall { step, call_id: call.id.clone(), name: call.name.clone(), arguments });
            }
            if self.cancelled() {
                return Err(AgentError::Aborted);
            }
            let approvals = self.unless_cancelled(self.approvals_needed(state, &calls, turn_tools)).await?;
            if !approvals.is_empty() {
                state.pending = Some(PendingStep { step, finish_reason, calls, approvals: approvals.clone(), usage });
                // Saved first: an approval someone acts on must belong to a run that can resume.
                self.save(state).await?;
                for approval in approvals {
                    emitter.emit(EventBody::ApprovalRequested { approval });
                }
                return Ok(RunOutput::paused(state));
            }
            let spent = UsageRecorder::default();
            let results = self
                .unless_cancelled(self.execute_calls(
                    StepCalls { step, calls: &calls, finish_reason: &finish_reason },
                    state,
                    turn_tools,
                    None,
                    &spent,
                    emitter,
                ))
                .await;
            // Before an abort is returned: what the calls spent before it was spent all the same.
            state.usage.merge(spent.take());
            state.messages.extend(results?);
            emitter.emit(EventBody::StepEnd { step, finish_reason, usage, tool_calls: calls.len() as u32 });
            self.save(state).await?;
        }
    }

    /// `Ok` when a turn is left after the `turns` taken (for the next answer, or for the
    /// results of `calls` calls); otherwise the max-turns error, counting those calls as not run.
    fn turn_left_for(&self, turns: u32, calls: usize) -> Result<(), AgentError> {
        if turns < self.config.max_turns {
            return Ok(());
        }
        Err(AgentError::MaxTurnsExceeded { max: self.config.max_turns, calls_not_run: calls as u32 })
    }

    /// Persists the run's state. A store write that never settles holds the run only until it
    /// is stopped: an abort (and `close()`, which aborts its runs and waits for them) ends it.
    /// The write, started by then (`select` polls it first), is left to land, and the next
    /// read of the run waits for it (see [`LateSaves`]).
    async fn save(&self, state: &RunState) -> Result<(), AgentError> {
        let Some(runs) = &self.runs else { return Ok(()) };
        let write = runs.save(state)?;
        match unless_cancelled(self.cancel.map(|c| &**c), write.clone()).await {
            Some(written) => written.map_err(AgentError::Store),
            None => {
                runs.late.leave(&state.run_id, write, runs.store.clone(), runs.keys(&state.run_id), self.env);
                Err(AgentError::Aborted)
            }
        }
    }

    /// The calls of a step that must wait for a human: known tools, arguments that parse, and
    /// a handler that asks for approval of these arguments.
    async fn approvals_needed(&self, state: &RunState, calls: &[ToolCall], tools: &ToolSet) -> Vec<PendingApproval> {
        let mut approvals = Vec::new();
        for call in calls {
            let Some(tool) = tools.get(&call.name).filter(|tool| tool.handler().may_need_approval()) else { continue };
            // Arguments that do not parse, nest too deep to be stored in the run's state, or
            // fail the input schema are refused when the call executes (invalid_arguments): it
            // never runs, so nobody is asked about it, and no predicate sees what it refuses.
            let Ok(arguments) = crate::tools::parse_arguments(&call.arguments) else { continue };
            if tool.input_schema().check(&arguments).is_ok() && tool.handler().needs_approval(&arguments).await {
                // What the call will act on: a default the model left out (an amount, say) is
                // what the human approves too.
                let arguments = tool.handler().approval_arguments(&arguments).await.unwrap_or(arguments);
                approvals.push(PendingApproval {
                    id: self.env.new_id("approval"),
                    kind: TOOL_CALL_APPROVAL.to_string(),
                    tool: call.name.clone(),
                    from_tier: None,
                    to_tier: None,
                    requested_at: self.env.now_ms(),
                    reason: format!("`{}` needs approval before it runs", call.name),
                    run_id: Some(state.run_id.clone()),
                    call_id: Some(call.id.clone()),
                    arguments: Some(arguments),
                    hash: None,
                });
            }
        }
        approvals
    }

    /// Runs a step's calls concurrently (at most `maxParallelTools` at once), emitting end
    /// events in call order, and returns the tool messages in call order. A call that finished
    /// waits for the ones before it to be reported, but not to free its slot: a slow first call
    /// does not hold up the rest. The model calls the calls make (a forge's judge) are recorded
    /// in `spent`, for the caller to add to the run's usage.
    async fn execute_calls(
        &self,
        step_calls: StepCalls<'_>,
        state: &RunState,
        tools: &ToolSet,
        decisions: Option<&[CallDecision]>,
        spent: &UsageRecorder,
        emitter: &Emitter<'_>,
    ) -> Vec<Message> {
        let limits = ExecutionLimits { max_result_bytes: self.config.max_result_bytes };
        let env = self.env;
        let run_id = &state.run_id;
        let session_id = &state.session_id;
        let cancel = self.cancel;
        let StepCalls { step, calls, .. } = step_calls;
        let mut finishing = stream::iter(calls.iter().enumerate().map(|(i, call)| async move {
            emitter.emit(EventBody::ToolExecuteStart { step, call_id: call.id.clone(), name: call.name.clone() });
            let ctx = CallContext {
                scope: state.scope.clone(),
                result_limit: Some(limits.max_result_bytes),
                cancel: cancel.cloned().map(RunSignal),
                usage: Some(spent.clone()),
                ..CallContext::new(run_id.clone(), call.id.clone(), session_id.clone())
            };
            let started = env.elapsed_ms();
            let outcome = match decisions.and_then(|d| d.get(i)) {
                Some(CallDecision::Deny(reason)) => {
                    ToolOutcome { arguments: None, result: Err(ToolFailure::new("denied", format!("a human denied this call: {reason}"))) }
                }
                // A resumed step's call that needed no approval: a tool ignoring its signal must
                // not hold the abort (or `close()`) until it ends.
                Some(CallDecision::Run) => {
                    unless_cancelled(cancel.map(|c| &**c), execute_call(tools, &call.name, &call.arguments, &ctx, limits)).await.unwrap_or_else(|| {
                        ToolOutcome { arguments: None, result: Err(ToolFailure::new("aborted", "the run was aborted while this call ran; it did not finish")) }
                    })
                }
                Some(CallDecision::Approved) | None => execute_call(tools, &call.name, &call.arguments, &ctx, limits).await,
            };
            (i, outcome, env.elapsed_ms() - started)
        }))
        .buffer_unordered(self.config.max_parallel_tools);

        let mut finished: Vec<Option<(ToolOutcome, f64)>> = vec![None; calls.len()];
        let mut messages = Vec::with_capacity(calls.len());
        while let Some((i, outcome, duration_ms)) = finishing.next().await {
            finished[i] = Some((outcome, duration_ms));
            while let Some((outcome, duration_ms)) = finished.get_mut(messages.len()).and_then(Option::take) {
                messages.push(step_calls.report(messages.len(), outcome, duration_ms, emitter));
            }
        }
        messages
    }
}

/// Whether a run is over for good, so nothing of it is kept to resume: it finished, or hit a
/// limit or its configuration (resuming it would fail the same way). A paused one was saved
/// when it paused, and one that failed on the model, a store or an abort stays resumable from
/// its last step.
pub(crate) fn run_ended(result: &Result<RunOutput, AgentError>) -> bool {
    match result {
        Ok(out) => out.status == RunStatus::Completed,
        Err(e) => matches!(
            e,
            AgentError::MaxTurnsExceeded { .. }
                | AgentError::MaxStepsExceeded { .. }
                | AgentError::StructuredOutputInvalid { .. }
                | AgentError::InvalidConfig(_)
        ),
    }
}

/// Shared handle type for models held by agents.
pub type SharedModel = Rc<dyn Model>;

/// The tool calls of one model answer, and how that answer ended.
#[derive(Clone, Copy)]
struct StepCalls<'a> {
    step: u32,
    calls: &'a [ToolCall],
    finish_reason: &'a str,
}

impl StepCalls<'_> {
    /// The tool message of call `index`, whose `outcome` is reported as its end event.
    fn report(self, index: usize, outcome: ToolOutcome, duration_ms: f64, emitter: &Emitter<'_>) -> Message {
        let StepCalls { step, calls, finish_reason } = self;
        let call = &calls[index];
        let is_error = outcome.result.is_err();
        // An answer cut off at the token limit ends inside its last call: say so where that
        // call's arguments are refused, or the model (and the host) see only broken JSON.
        let cut_off = finish_kind(finish_reason) == "length" && index + 1 == calls.len();
        let content = match outcome.result {
            Ok(mut result) => {
                if cut_off && call.name == FORGE_TOOL_NAME {
                    note_cut_off_forge_request(&mut result, finish_reason);
                }
                let content = serde_json::to_string(&result).unwrap_or_default();
                emitter.emit(EventBody::ToolExecuteEnd { step, call_id: call.id.clone(), name: call.name.clone(), result, duration_ms });
                content
            }
            Err(mut error) => {
                if error.code == "invalid_arguments" && cut_off {
                    error.message = format!("{}; {}", error.message, cut_off_note(finish_reason));
                }
                let content = serde_json::json!({ "error": { "code": error.code, "message": error.message } }).to_string();
                emitter.emit(EventBody::ToolExecuteError { step, call_id: call.id.clone(), name: call.name.clone(), error, duration_ms });
                content
            }
        };
        Message::Tool { tool_call_id: call.id.clone(), name: call.name.clone(), content, is_error }
    }
}

/// What a call cut off at the token limit is told beside why it was refused: a larger budget or
/// a shorter call is the fix, where the same call again is cut off again.
fn cut_off_note(finish_reason: &str) -> String {
    format!(
        "the answer stopped at its token limit (finish reason `{finish_reason}`) inside these arguments: a larger maxTokens, or a shorter call, lets it finish"
    )
}

/// Adds [`cut_off_note`] to a cut-off `forge_tool` call's `parse_error` rejection. The forge
/// answers a bad request with a result, not an `invalid_arguments` error, so without this the
/// model reads only that the JSON ended early.
fn note_cut_off_forge_request(result: &mut Value, finish_reason: &str) {
    if result["category"] != RejectionCategory::ParseError.as_str() {
        return;
    }
    if let Some(Value::String(reason)) = result.get_mut("reason") {
        reason.push_str("; ");
        reason.push_str(&cut_off_note(finish_reason));
    }
}

fn is_object_schema(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) == Some("object")
}

/// The object schema a root `{ "$ref": "#/$defs/Person", "$defs": { … } }` names, with the
/// root's definitions beside it (so the references inside it still resolve); `None` for any
/// other root.
fn referenced_root(schema: &Value) -> Option<Value> {
    let pointer = schema.get("$ref")?.as_str()?.strip_prefix('#')?;
    let mut target = schema.pointer(pointer).filter(|t| is_object_schema(t))?.as_object()?.clone();
    for key in ["$defs", "definitions"] {
        if let Some(definitions) = schema.get(key) {
            target.entry(key).or_insert_with(|| definitions.clone());
        }
    }
    Some(Value::Object(target))
}

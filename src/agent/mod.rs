//! The agent: configuration, tools, conversation memory per session, and the run loop.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::rc::Rc;

mod approval;
mod claim;
mod config;
mod env;
mod error;
mod events;
mod history;
mod late_saves;
mod run;
mod structured;
mod usage;

pub use approval::{ApprovalDecision, PendingApproval, PendingStep, TOOL_CALL_APPROVAL};
pub use config::AgentConfig;
pub use env::{unless_cancelled, CancelFlag, CancelSignal, Environment, LocalTask, NativeEnvironment};
pub use error::AgentError;
pub use events::{AgentEvent, CollectingSink, ErrorInfo, EventBody, EventSink};
pub use history::{HistoryLimits, DEFAULT_HISTORY_MAX_BYTES};
pub use run::{RunOutput, RunState, RunStatus, SharedModel, StoredRun, StoredRunStatus};
pub(crate) use structured::unfenced;
pub use structured::{embedded_values, extract_json, json_values, OutputCheck, OutputRefusal};
pub use usage::{RunUsage, UsageRecorder};

use crate::guard::{KeptTickets, SessionTicket, SessionWork};
use crate::model::{Message, Model};
use crate::store::Store;
use crate::tools::{CompiledSchema, Tool, ToolSet};
use claim::{ResumeClaim, RunPosition};
use history::{RunStart, SessionHistory};
use late_saves::LateSaves;
use run::{read_run_state, run_ended, RunContext, RunRecorder};

/// Supplies the tools of each model turn. The agent asks before every turn, so a tool
/// registered during turn 1 (e.g. by `forge_tool`) is offered and callable in turn 2.
/// `host` is the agent's own tool set.
pub trait ToolProvider {
    fn tools(&self, session_id: &str, host: &ToolSet) -> ToolSet;
}

/// Session used when a run names none.
pub const DEFAULT_SESSION: &str = "default";

/// Resumable runs of each kind whose session this context follows (see `Agent::paused`);
/// older ones are forgotten first and then count as left before a restart.
const RESUMABLE_KEPT: usize = 4096;

/// How many run locks [`Agent::stored_runs`] asks the store about at once.
const STORED_RUN_LOCKS_AT_ONCE: usize = 32;

/// A new agent instance's history epoch: the environment's id tells processes apart (its ids
/// do not collide across restarts), the count agents of one process (an environment's ids may
/// start over with each agent).
fn new_history_epoch(env: &dyn Environment) -> String {
    static AGENTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!("{}.{}", env.new_id("history"), AGENTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

/// Per-run options.
#[derive(Default)]
pub struct RunOptions {
    pub session_id: Option<String>,
    pub cancel: Option<Rc<dyn CancelSignal>>,
    /// Run ids of enclosing runs (nested agents); empty for a top-level run.
    pub parent_path: Vec<String>,
    /// Run id chosen by the host (it keys per-run state such as the abort signal); generated
    /// when absent.
    pub run_id: Option<String>,
    /// Scope label (a task id, say) the run's `forge_tool` attempts are tagged with, unless a
    /// request gives its own `scope`; kept in the run's state, so a resumed run keeps it.
    pub scope: Option<String>,
}

impl std::fmt::Debug for RunOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunOptions").field("session_id", &self.session_id).finish_non_exhaustive()
    }
}

/// An agent: a model, tools and instructions, remembering each session's conversation.
pub struct Agent {
    config: AgentConfig,
    returns: Option<CompiledSchema>,
    model: Rc<dyn Model>,
    tools: RefCell<ToolSet>,
    env: Rc<dyn Environment>,
    sessions: RefCell<HashMap<String, SessionHistory>>,
    /// This instance's identity for the session positions it counts (see `RunState::history_epoch`).
    history_epoch: String,
    /// Runs going, per session: one that completes after its session ended must not bring the
    /// conversation back.
    runs_going: SessionWork,
    /// The tickets of runs left resumable in this context, by run id: such a run is still
    /// going, so one resumed after its session ended adds nothing either. Paused runs and runs
    /// interrupted with a store (a model error, an abort) are kept apart, at most
    /// [`RESUMABLE_KEPT`] each, so a service with many failures does not push out the paused
    /// runs waiting on people. A run left before a restart has none and brings its conversation
    /// back (it cannot tell a restart from an ended session).
    paused: RefCell<KeptTickets>,
    interrupted: RefCell<KeptTickets>,
    store: Option<Rc<dyn Store>>,
    /// Saves of run states an abort left unsettled, waited for before a run's state is read.
    late_saves: Rc<LateSaves>,
    agent_id: String,
    provider: RefCell<Option<Rc<dyn ToolProvider>>>,
    output_check: Option<Rc<dyn OutputCheck>>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Agent {
    /// Builds an agent; fails on a configuration no run could use.
    pub fn new(config: AgentConfig, model: Rc<dyn Model>, tools: ToolSet, env: Rc<dyn Environment>) -> Result<Self, AgentError> {
        config.validate().map_err(AgentError::InvalidConfig)?;
        let returns = match &config.returns {
            Some(schema) => Some(CompiledSchema::compile(schema).map_err(|e| AgentError::InvalidConfig(format!("returns: {e}")))?),
            None => None,
        };
        let history_epoch = new_history_epoch(env.as_ref());
        Ok(Self {
            config,
            returns,
            model,
            tools: RefCell::new(tools),
            env,
            sessions: RefCell::new(HashMap::new()),
            history_epoch,
            runs_going: SessionWork::default(),
            paused: RefCell::new(KeptTickets::new(RESUMABLE_KEPT)),
            interrupted: RefCell::new(KeptTickets::new(RESUMABLE_KEPT)),
            store: None,
            late_saves: Rc::default(),
            agent_id: "default".into(),
            provider: RefCell::new(None),
            output_check: None,
        })
    }

    /// Has `check` look at every final answer the `returns` schema accepted (see [`OutputCheck`]).
    pub fn with_output_check(mut self, check: Rc<dyn OutputCheck>) -> Self {
        self.output_check = Some(check);
        self
    }

    /// Persists run states in `store` under `agent/<agent_id>/run/<runId>`, saved at every step
    /// boundary and when paused, and the conversation each run started from under
    /// `agent/<agent_id>/run-history/<runId>`, saved once per run and resume; both are
    /// removed when the run completes.
    pub fn with_store(mut self, store: Rc<dyn Store>, agent_id: impl Into<String>) -> Self {
        self.store = Some(store);
        self.agent_id = agent_id.into();
        self
    }

    pub fn agent_id(&self) -> &str {
        &self.agent_id
    }

    fn run_prefix(&self) -> String {
        format!("agent/{}/run/", self.agent_id)
    }

    fn recorder(&self) -> Option<RunRecorder> {
        self.store.clone().map(|store| RunRecorder::new(store, &format!("agent/{}/", self.agent_id), self.late_saves.clone()))
    }

    /// The persisted state of a paused or interrupted run.
    pub async fn load_run(&self, run_id: &str) -> Result<RunState, AgentError> {
        let runs = self.recorder().ok_or_else(|| AgentError::InvalidResume("this agent has no store".into()))?;
        self.late_saves.wait_for(run_id).await;
        runs.load(run_id).await?.ok_or_else(|| AgentError::InvalidResume(format!("no persisted run `{run_id}`")))
    }

    /// Continues a paused run (or one interrupted between steps) from `state`, applying
    /// `decisions` to the calls that waited for approval. Denied calls become error results
    /// the model sees. A state is resumed once: with a store, it must still be the run's
    /// stored state (read under the run's store lock), so a second resume of it, here or in
    /// another tab, is an `invalid_resume` error rather than a second execution of its
    /// approved calls (see `claim`). With a store, `state` only says which point of the run
    /// is resumed: the stored state is what runs, so calls edited in `state` after the pause
    /// are not the calls that run.
    pub async fn resume_state(
        &self,
        state: RunState,
        decisions: &[ApprovalDecision],
        cancel: Option<Rc<dyn CancelSignal>>,
        sink: &mut dyn EventSink,
    ) -> Result<RunOutput, AgentError> {
        let run_id = state.run_id.clone();
        let (claim, state) = self
            .claim(&run_id, cancel.as_deref(), async {
                if self.store.is_none() {
                    return Ok(state);
                }
                let stored = self.load_run(&run_id).await.map_err(|e| match e {
                    AgentError::InvalidResume(_) => AgentError::InvalidResume(format!(
                        "run `{run_id}` is not paused in this agent's store: it was resumed to its end already (or belongs to another store)"
                    )),
                    other => other,
                })?;
                if RunPosition::of(&stored) != RunPosition::of(&state) {
                    return Err(AgentError::InvalidResume(format!("this agent's store holds a later state of run `{run_id}`: it was resumed already")));
                }
                Ok(stored)
            })
            .await?;
        self.resume_claimed(&claim, state, decisions, cancel, sink).await
    }

    /// Takes `run_id`'s claim, then reads its state with `read`. Both wait on the store (its
    /// lock held by a resume in another tab, a store that does not answer): a cancel ends the
    /// wait with `Aborted`, so an aborted resume (and `close()`, which waits for it) is not
    /// held by it.
    async fn claim(
        &self,
        run_id: &str,
        cancel: Option<&dyn CancelSignal>,
        read: impl Future<Output = Result<RunState, AgentError>>,
    ) -> Result<(ResumeClaim, RunState), AgentError> {
        let claimed = async {
            let claim = ResumeClaim::take(run_id, self.store.as_deref(), &self.run_lock_name(run_id)).await?;
            Ok((claim, read.await?))
        };
        unless_cancelled(cancel, claimed).await.unwrap_or(Err(AgentError::Aborted))
    }

    /// Resumes `state` under `claim`: decisions that do not fit the paused step, and a cancel
    /// that came before the resume, are refused before the state counts as resumed, so a
    /// corrected resume can follow (an aborted one would otherwise run the approved calls,
    /// which are never abandoned once started, and leave nothing to resume).
    async fn resume_claimed(
        &self,
        claim: &ResumeClaim,
        state: RunState,
        decisions: &[ApprovalDecision],
        cancel: Option<Rc<dyn CancelSignal>>,
        sink: &mut dyn EventSink,
    ) -> Result<RunOutput, AgentError> {
        if let Some(pending) = &state.pending {
            pending.resolve(decisions).map_err(AgentError::InvalidResume)?;
        }
        if cancel.as_deref().is_some_and(|c| c.is_cancelled()) {
            // Ended as an aborted run() is: `agent.error` with the run's usage so far.
            let error = AgentEvent {
                run_id: state.run_id.clone(),
                run_path: state.run_path.clone(),
                body: EventBody::AgentError { error: AgentError::Aborted.info(), usage: state.usage },
            };
            sink.emit(error);
            return Err(AgentError::Aborted);
        }
        let position = RunPosition::of(&state);
        claim.consume(&state)?;
        let result = self.drive(state, cancel.as_ref(), decisions, sink).await;
        if result.is_err() {
            claim.unconsume_after_failure(position, self.store.is_some());
        }
        result
    }

    /// The store lock a resume of `run_id` holds (see `claim`).
    fn run_lock_name(&self, run_id: &str) -> String {
        format!("run:{}/{run_id}", self.agent_id)
    }

    /// Runs the loop from `state` with this agent's model, tools and store, and on completion
    /// extends the session's conversation.
    async fn drive(
        &self,
        state: RunState,
        cancel: Option<&Rc<dyn CancelSignal>>,
        decisions: &[ApprovalDecision],
        sink: &mut dyn EventSink,
    ) -> Result<RunOutput, AgentError> {
        let session_id = state.session_id.clone();
        let tools = self.tools();
        let provider = self.provider.borrow().clone();
        let ctx = RunContext {
            provider: provider.as_deref(),
            config: &self.config,
            returns: self.returns.as_ref(),
            output_check: self.output_check.as_deref(),
            model: self.model.as_ref(),
            tools: &tools,
            env: self.env.as_ref(),
            cancel,
            runs: self.recorder(),
            decisions,
        };
        let start = state.history_len.map(|len| (len, state.history_offset.unwrap_or(0), state.history_epoch.clone()));
        let run_id = state.run_id.clone();
        let ticket = self.take_resumable(&run_id).unwrap_or_else(|| self.runs_going.begin(&session_id));
        let (_state, result) = ctx.drive(state, sink).await;
        if !ticket.session_ended() {
            self.remember(&session_id, start, &result);
        }
        if matches!(&result, Ok(out) if out.status == RunStatus::Paused) {
            self.paused.borrow_mut().keep(run_id, ticket);
        } else if self.store.is_some() && !run_ended(&result) {
            self.interrupted.borrow_mut().keep(run_id, ticket);
        }
        result
    }

    /// The ticket `run_id` kept when it was left resumable in this context, if it was.
    fn take_resumable(&self, run_id: &str) -> Option<SessionTicket> {
        self.paused.borrow_mut().take(run_id).or_else(|| self.interrupted.borrow_mut().take(run_id))
    }

    /// The runs whose state this agent's store holds: paused ones (waiting for approvals), ones
    /// interrupted between steps (a model error, an abort, a process that ended), and running
    /// ones, in run id order. A run is running while a run or resume of it holds its claim here
    /// or its store lock anywhere (another tab, when the store can tell: see
    /// [`Store::lock_held`]). Records that are not run states this build reads are left out.
    pub async fn stored_runs(&self) -> Result<Vec<StoredRun>, AgentError> {
        let Some(store) = self.store.as_deref() else { return Ok(vec![]) };
        let records = store.scan(&self.run_prefix()).await.map_err(AgentError::Store)?;
        let states: Vec<_> = records.into_iter().filter_map(|(_, value)| read_run_state(value).ok()).collect();
        // The store is asked about a batch of locks at once, not one after another: a store's
        // `tryLock` may take a while (500 runs at 1 ms each took half a second). Batches, as a
        // lock asked for is held until it is given back. `join_all`, not `try_join_all`: a
        // `tryLock` dropped before it answers would never give back the lock it got.
        let mut running = Vec::with_capacity(states.len());
        for batch in states.chunks(STORED_RUN_LOCKS_AT_ONCE) {
            let held = futures::future::join_all(batch.iter().map(|state| async move {
                if claim::claimed_here(&state.run_id) {
                    return Ok(true);
                }
                store.lock_held(&self.run_lock_name(&state.run_id)).await
            }))
            .await;
            for held in held {
                running.push(held.map_err(AgentError::Store)?);
            }
        }
        Ok(states.into_iter().zip(running).map(|(state, running)| StoredRun::of(state, running)).collect())
    }

    /// Deletes the stored state of `run_id`, a run that will not be resumed; `true` when there
    /// was one, or a save of it an abort left out (deleted once it lands). It takes the run's claim first, so it never pulls a state from under a resume
    /// (one in this context is `invalid_resume`; one elsewhere is waited for).
    pub async fn discard_run(&self, run_id: &str) -> Result<bool, AgentError> {
        let Some(runs) = self.recorder() else { return Ok(false) };
        let _claim = ResumeClaim::take(run_id, Some(&*runs.store), &self.run_lock_name(run_id)).await?;
        // A save an abort left out deletes what it writes once it lands: waiting for it here
        // would hold every discard behind one write that never settles.
        let late = self.late_saves.discard(run_id);
        let stored = runs.store.get(&runs.key(run_id)).await.map_err(AgentError::Store)?.is_some();
        // Both records go even when the state is gone: a starting conversation left by a build
        // that deleted the state alone would be listed nowhere, and kept for good.
        runs.forget(run_id).await?;
        if stored {
            self.take_resumable(run_id);
        }
        Ok(stored || late)
    }

    /// [`Agent::resume_state`] from the state persisted in the agent's store.
    pub async fn resume(
        &self,
        run_id: &str,
        decisions: &[ApprovalDecision],
        cancel: Option<Rc<dyn CancelSignal>>,
        sink: &mut dyn EventSink,
    ) -> Result<RunOutput, AgentError> {
        let (claim, state) = self.claim(run_id, cancel.as_deref(), self.load_run(run_id)).await?;
        self.resume_claimed(&claim, state, decisions, cancel, sink).await
    }

    /// Adds a completed run's own messages to its session; `start` is where it started in the
    /// session (`history_len`, `history_offset`, `history_epoch` of its state). Other runs of
    /// the session may have completed while it ran: their messages stay, and this run's follow
    /// them. A run started by another agent instance (the process restarted before a resume)
    /// brings the messages it started from that the session does not hold yet, after those it
    /// holds (see `SessionHistory::add_run`). The oldest exchanges past `sessionHistory` are
    /// then dropped. (A session that ended while the run was going, or left resumable in this
    /// context, gets nothing.)
    fn remember(&self, session_id: &str, start: Option<(u32, u64, Option<String>)>, result: &Result<RunOutput, AgentError>) {
        let Ok(out) = result else { return };
        if out.status != RunStatus::Completed {
            return;
        }
        let mut sessions = self.sessions.borrow_mut();
        let history = sessions.entry(session_id.to_string()).or_default();
        let start = start.as_ref().map(|(len, offset, epoch)| RunStart { len: *len as usize, offset: *offset, epoch: epoch.as_deref() });
        history.add_run(&out.messages, start, &self.history_epoch, &self.config.session_history);
    }

    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// Adds or replaces a tool; later turns see it.
    pub fn add_tool(&self, tool: Tool) {
        self.tools.borrow_mut().insert(tool);
    }

    pub fn remove_tool(&self, name: &str) -> bool {
        self.tools.borrow_mut().remove(name).is_some()
    }

    /// Asks `provider` for the tools of every turn (e.g. the emergent tool registry).
    pub fn set_tool_provider(&self, provider: Option<Rc<dyn ToolProvider>>) {
        *self.provider.borrow_mut() = provider;
    }

    /// A snapshot of the current tools.
    pub fn tools(&self) -> ToolSet {
        self.tools.borrow().clone()
    }

    /// The conversation of `session_id` so far.
    pub fn history(&self, session_id: &str) -> Vec<Message> {
        self.sessions.borrow().get(session_id).map(|h| h.messages().to_vec()).unwrap_or_default()
    }

    /// Forgets a session's conversation; runs of it still going add nothing when they end.
    pub fn end_session(&self, session_id: &str) {
        self.sessions.borrow_mut().remove(session_id);
        self.runs_going.end(session_id);
    }

    /// Runs one user input to a final answer, emitting every event to `sink`. On success the
    /// session's conversation is extended with the run; on failure it is left unchanged.
    pub async fn run(&self, input: &str, options: RunOptions, sink: &mut dyn EventSink) -> Result<RunOutput, AgentError> {
        let session_id = options.session_id.unwrap_or_else(|| DEFAULT_SESSION.to_string());
        let run_id = options.run_id.unwrap_or_else(|| self.env.new_id("run"));
        // Held while the run goes, as a resume holds it: each step is saved, and another agent
        // on the store (a second tab) would take a saved step for an interrupted run and drive
        // it a second time, its tool calls too. Taken before the run starts, so a store that
        // cannot lock fails it before any event.
        let _claim = match self.store {
            Some(_) => Some(ResumeClaim::take(&run_id, self.store.as_deref(), &self.run_lock_name(&run_id)).await?),
            None => None,
        };
        let mut run_path = options.parent_path;
        run_path.push(run_id.clone());
        let (mut messages, history_offset) = match self.sessions.borrow().get(&session_id) {
            Some(history) => (history.messages().to_vec(), history.dropped()),
            None => (vec![], 0),
        };
        let history_len = Some(messages.len() as u32);
        messages.push(Message::User { content: input.to_string() });
        sink.emit(AgentEvent {
            run_id: run_id.clone(),
            run_path: run_path.clone(),
            body: EventBody::AgentStart { session_id: session_id.clone(), input: input.to_string(), model: self.model.id() },
        });
        let state = RunState {
            run_id,
            run_path,
            session_id: session_id.clone(),
            messages,
            turns: 0,
            steps: 0,
            output_retries: 0,
            usage: RunUsage::default(),
            pending: None,
            history_len,
            history_offset: Some(history_offset),
            history_epoch: Some(self.history_epoch.clone()),
            scope: options.scope.as_deref().map(crate::forge::scope_label),
        };
        self.drive(state, options.cancel.as_ref(), &[], sink).await
    }
}

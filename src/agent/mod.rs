//! The agent: configuration, tools, conversation memory per session, and the run loop.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

mod config;
mod env;
mod error;
mod events;
mod run;
mod structured;
mod usage;

pub use config::AgentConfig;
pub use env::{CancelFlag, CancelSignal, Environment, NativeEnvironment};
pub use error::AgentError;
pub use events::{AgentEvent, CollectingSink, ErrorInfo, EventBody, EventSink};
pub use run::{RunOutput, RunState, SharedModel};
pub use structured::extract_json;
pub use usage::RunUsage;

use crate::model::{Message, Model};
use crate::tools::{CompiledSchema, Tool, ToolSet};
use run::RunContext;

/// Supplies the tools of each model turn. The agent asks before every turn, so a tool
/// registered during turn 1 (e.g. by `forge_tool`) is offered and callable in turn 2.
/// `host` is the agent's own tool set.
pub trait ToolProvider {
    fn tools(&self, session_id: &str, host: &ToolSet) -> ToolSet;
}

/// Session used when a run names none.
pub const DEFAULT_SESSION: &str = "default";

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
    sessions: RefCell<HashMap<String, Vec<Message>>>,
    provider: RefCell<Option<Rc<dyn ToolProvider>>>,
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
        Ok(Self { config, returns, model, tools: RefCell::new(tools), env, sessions: RefCell::new(HashMap::new()), provider: RefCell::new(None) })
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
        self.sessions.borrow().get(session_id).cloned().unwrap_or_default()
    }

    /// Forgets a session's conversation.
    pub fn end_session(&self, session_id: &str) {
        self.sessions.borrow_mut().remove(session_id);
    }

    /// Runs one user input to a final answer, emitting every event to `sink`. On success the
    /// session's conversation is extended with the run; on failure it is left unchanged.
    pub async fn run(&self, input: &str, options: RunOptions, sink: &mut dyn EventSink) -> Result<RunOutput, AgentError> {
        let session_id = options.session_id.unwrap_or_else(|| DEFAULT_SESSION.to_string());
        let run_id = options.run_id.unwrap_or_else(|| self.env.new_id("run"));
        let mut run_path = options.parent_path;
        run_path.push(run_id.clone());
        let mut messages = self.history(&session_id);
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
        };
        let tools = self.tools();
        let provider = self.provider.borrow().clone();
        let ctx = RunContext {
            provider: provider.as_deref(),
            config: &self.config,
            returns: self.returns.as_ref(),
            model: self.model.as_ref(),
            tools: &tools,
            env: self.env.as_ref(),
            cancel: options.cancel.as_deref(),
        };
        let (_state, result) = ctx.drive(state, sink).await;
        if let Ok(out) = &result {
            self.sessions.borrow_mut().insert(session_id, out.messages.clone());
        }
        result
    }
}

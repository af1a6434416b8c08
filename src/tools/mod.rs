//! Tools: specs, the handler trait, the per-agent tool set, and the executor that validates
//! arguments, runs the handler and checks the result.

use std::collections::BTreeMap;
use std::rc::Rc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::ToolDefinition;

mod executor;
mod schema;

pub(crate) use executor::parse_arguments;
pub use executor::{check_output, execute_call, invoke, invoke_keeping_output, takes_unparsed, ExecutionLimits, ToolOutcome};
pub use schema::{CompiledSchema, SchemaAuthor, SchemaError};

/// Why a tool call produced an error result instead of output. The model sees `code` and
/// `message`; the loop goes on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[cfg_attr(feature = "wasm-core", derive(tsify::Tsify))]
#[error("{code}: {message}")]
pub struct ToolFailure {
    /// `unknown_tool`, `invalid_arguments`, `execution_failed`, `result_too_large`,
    /// `invalid_output`, `aborted`, `denied`, and for forged code `sandbox_timeout`,
    /// `sandbox_memory`, `sandbox_rejected`, `sandbox_unavailable`; `too_many_calls` for a host
    /// tool calling back into its agent past the bound on calls waiting.
    pub code: String,
    pub message: String,
}

impl ToolFailure {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self { code: code.into(), message: message.into() }
    }
}

/// The first `max_chars` characters of `text`, with `…` when it was cut: messages quote model
/// output, arguments and values, which can be megabytes long.
pub(crate) fn shorten(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// How many bytes `value` takes as JSON, counted as it is written, without a buffer: how
/// results, step data and requests are measured against their limits.
pub fn json_len<T: Serialize + ?Sized>(value: &T) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // A value that cannot be written (a map with non-string keys) counts as too large.
    serde_json::to_writer(&mut counter, value).map_or(usize::MAX, |()| counter.0)
}

/// Deepest nesting of arrays and objects accepted in tool arguments and forge requests. They
/// are stored inside records (a tool's versions, a paused run's approvals) a few levels down,
/// and a record nested past serde_json's 128 levels could not be read back.
pub const MAX_VALUE_DEPTH: usize = 64;

/// Whether `e` is serde_json's refusal of JSON text nested past the 128 levels it reads: the
/// text may be well-formed, so it is said as depth, not as malformed JSON.
pub fn is_too_deep(e: &serde_json::Error) -> bool {
    e.to_string().starts_with("recursion limit exceeded")
}

/// How deeply `v` nests arrays and objects (a scalar is 0).
pub fn nesting_depth(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(nesting_depth).max().unwrap_or(0),
        Value::Object(m) => 1 + m.values().map(nesting_depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// Context a handler receives with each call.
#[derive(Debug, Clone, Default)]
pub struct CallContext {
    /// The run the call belongs to; for a call made through the registry API (`direct`), an
    /// id the host gave that call to find its abort signal by, or empty.
    pub run_id: String,
    pub call_id: String,
    pub session_id: String,
    /// How many compose pipelines this call is nested in (0 for a direct call); bounds
    /// pipelines that reach themselves through other tools.
    pub depth: u32,
    /// A forge-time test or a promotion's re-run of the tests, not a use: the forged tools it
    /// reaches (a pipeline's steps among them) do not count it in their stats or towards
    /// their promotion.
    pub trial: bool,
    /// Made through the registry API, not by a run: `run_id` names no run.
    pub direct: bool,
    /// What this call may still spend in pipelines, nested ones included: set by the outermost
    /// compose pipeline and shared with the pipelines it reaches. `None` outside any pipeline.
    pub pipeline_budget: Option<Rc<crate::forge::PipelineBudget>>,
    /// The run's scope label, which a `forge_tool` call tags its attempt with.
    pub scope: Option<String>,
    /// The most bytes of JSON a run takes as this call's result (its `maxResultBytes`): a
    /// handler whose result can be told in fewer words (`forge_tool`) fits it, rather than
    /// have it refused as `result_too_large`. `None` outside a run.
    pub result_limit: Option<usize>,
    /// The abort signal of the run the call belongs to (`None` outside a run): a handler that
    /// must not record what an abort cut short (`forge_tool`) watches it.
    pub cancel: Option<RunSignal>,
    /// Where the call records the model calls it makes for its run (`forge_tool`'s judge), so
    /// the run's usage counts them. `None` outside a run.
    pub usage: Option<crate::agent::UsageRecorder>,
}

/// A run's abort signal as a call sees it.
#[derive(Clone)]
pub struct RunSignal(pub Rc<dyn crate::agent::CancelSignal>);

impl std::fmt::Debug for RunSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RunSignal").field(&self.0.is_cancelled()).finish()
    }
}

impl CallContext {
    /// The context of a call made directly (not from inside a compose pipeline).
    pub fn new(run_id: impl Into<String>, call_id: impl Into<String>, session_id: impl Into<String>) -> Self {
        Self { run_id: run_id.into(), call_id: call_id.into(), session_id: session_id.into(), ..Self::default() }
    }

    /// The context of a test run (see [`CallContext::trial`]).
    pub fn for_trial(run_id: impl Into<String>, call_id: impl Into<String>, session_id: impl Into<String>) -> Self {
        Self { trial: true, ..Self::new(run_id, call_id, session_id) }
    }

    /// What a call made from inside this one continues: its nesting, its pipeline budget and
    /// whether it is a trial.
    pub fn nesting(&self) -> Nesting {
        Nesting { depth: self.depth, trial: self.trial, pipeline_budget: self.pipeline_budget.clone() }
    }
}

/// What a call continues from the call it is made inside ([`CallContext::nesting`]): a host
/// tool that calls a forged tool back while a pipeline runs it continues that pipeline's depth
/// and budget (so a pipeline reaching itself that way meets the same bounds as through other
/// pipelines), and a test's trial stays a trial. [`Nesting::default`]: a call of its own.
#[derive(Debug, Clone, Default)]
pub struct Nesting {
    pub depth: u32,
    pub trial: bool,
    pub pipeline_budget: Option<Rc<crate::forge::PipelineBudget>>,
}

/// Finds tools by name for `session_id` at the moment a call needs them. Compose pipelines
/// resolve their steps through this at call time, so a pipeline reaches the tools its caller's
/// session sees now, and building one never has to build (or rebuild) the others.
pub trait ToolLookup {
    /// The tool `session_id` reaches under `name`.
    fn lookup(&self, name: &str, session_id: &str) -> Option<Tool>;
    /// Whether `session_id` reaches a tool `name` (without building it).
    fn contains(&self, name: &str, session_id: &str) -> bool;
    /// The names `session_id` reaches (for error messages).
    fn available(&self, session_id: &str) -> Vec<String>;
    /// The tools called by the steps of `name` when it is a compose pipeline this lookup
    /// knows (empty otherwise): a build uses it to refuse a pipeline that would reach itself.
    fn pipeline_steps(&self, _name: &str, _session_id: &str) -> Vec<String> {
        Vec::new()
    }
}

impl ToolLookup for ToolSet {
    fn lookup(&self, name: &str, _session_id: &str) -> Option<Tool> {
        self.get(name).cloned()
    }

    fn contains(&self, name: &str, _session_id: &str) -> bool {
        self.tools.contains_key(name)
    }

    fn available(&self, _session_id: &str) -> Vec<String> {
        self.tools.keys().cloned().collect()
    }
}

/// Runs one tool. Host tools (TS `execute`), forged tools (sandbox or compose) and meta-tools
/// all implement this.
#[async_trait(?Send)]
pub trait ToolHandler {
    async fn call(&self, args: Value, ctx: &CallContext) -> Result<Value, ToolFailure>;

    /// Whether a call with these (schema-valid) arguments must wait for a human decision.
    async fn needs_approval(&self, _args: &Value) -> bool {
        false
    }

    /// Whether [`needs_approval`](ToolHandler::needs_approval) may answer yes for some
    /// arguments. When it may not, a call's arguments are not parsed to ask it (the executor
    /// parses them once, or, for a handler that takes long text unparsed, never).
    fn may_need_approval(&self) -> bool {
        true
    }

    /// The arguments to show the human deciding on a call, when they differ from the model's:
    /// those `call` will act on, after a parse of the handler's own fills in defaults or
    /// transforms them (a host tool's Standard Schema). `None` shows the model's arguments.
    async fn approval_arguments(&self, _args: &Value) -> Option<Value> {
        None
    }

    /// Whether argument text that is not JSON reaches `call` as a JSON string instead of failing
    /// the call: for a handler that repairs or rejects malformed requests itself. `forge_tool`
    /// does, since a garbled request is a classified forge rejection (`parse_error`) counted in
    /// the forge stats, which a generic `invalid_arguments` failure would never be.
    fn accepts_raw_arguments(&self) -> bool {
        false
    }

    /// For a handler that [accepts raw arguments](ToolHandler::accepts_raw_arguments): argument
    /// text longer than this reaches `call` unparsed, as a JSON string, for the handler to
    /// refuse by its length. Parsed, a few MiB of many small values take many times their size
    /// in memory (the core's never shrinks).
    fn raw_arguments_past(&self) -> Option<usize> {
        None
    }
}

/// The failure of a call whose result is past the run's `maxResultBytes` (`limit`); `size`
/// says how much it returned (`"70000 bytes of JSON"`).
pub fn result_too_large(name: &str, size: &str, limit: usize) -> ToolFailure {
    ToolFailure::new("result_too_large", format!("`{name}` returned {size}; the limit is {limit} bytes"))
}

/// A tool the agent can call: its public contract plus its handler. Cloning is one reference
/// count: registries hand out tools per call and compose pipelines look theirs up per step.
#[derive(Clone, Debug)]
pub struct Tool(Rc<ToolParts>);

/// What a [`Tool`] is made of (reached through `Deref`: `tool.name`, `tool.description`).
#[derive(Clone)]
pub struct ToolParts {
    pub name: String,
    pub description: String,
    input: Rc<CompiledSchema>,
    output: Option<Rc<CompiledSchema>>,
    handler: Rc<dyn ToolHandler>,
    /// The input schema shown to the model when it differs from the one arguments are checked
    /// against (see [`Tool::advertising`]).
    advertised: Option<Rc<Value>>,
}

impl std::ops::Deref for Tool {
    type Target = ToolParts;

    fn deref(&self) -> &ToolParts {
        &self.0
    }
}

impl std::fmt::Debug for ToolParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tool").field("name", &self.name).finish_non_exhaustive()
    }
}

impl Tool {
    /// Builds a tool of the host's, compiling its schemas once. Fails if a schema is not JSON
    /// Schema.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: &Value,
        output_schema: Option<&Value>,
        handler: Rc<dyn ToolHandler>,
    ) -> Result<Self, SchemaError> {
        Self::new_by(SchemaAuthor::Host, name, description, input_schema, output_schema, handler)
    }

    /// Builds a tool whose schemas `author` wrote (see [`SchemaAuthor`]).
    pub fn new_by(
        author: SchemaAuthor,
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: &Value,
        output_schema: Option<&Value>,
        handler: Rc<dyn ToolHandler>,
    ) -> Result<Self, SchemaError> {
        let compile = |schema: &Value| CompiledSchema::compile_by(schema, author).map(Rc::new);
        Ok(Self(Rc::new(ToolParts {
            name: name.into(),
            description: description.into(),
            input: compile(input_schema)?,
            output: output_schema.map(compile).transpose()?,
            handler,
            advertised: None,
        })))
    }

    /// Shows the model `schema` instead of the (more permissive) schema the arguments are
    /// validated against. Used by `forge_tool`: validation accepts the messy shapes
    /// [`crate::forge::normalize`] repairs, while the model is shown one concrete shape, which
    /// chat templates render as a call skeleton.
    pub fn advertising(self, schema: Value) -> Self {
        let mut parts = Rc::unwrap_or_clone(self.0);
        parts.advertised = Some(Rc::new(schema));
        Self(Rc::new(parts))
    }

    pub fn definition(&self) -> ToolDefinition {
        ToolDefinition {
            name: self.name.clone(),
            description: self.description.clone(),
            input_schema: match &self.advertised {
                Some(schema) => (**schema).clone(),
                None => self.input.source().clone(),
            },
        }
    }

    pub fn input_schema(&self) -> &CompiledSchema {
        &self.input
    }

    pub fn output_schema(&self) -> Option<&CompiledSchema> {
        self.output.as_deref()
    }

    pub fn handler(&self) -> &Rc<dyn ToolHandler> {
        &self.handler
    }
}

/// The tools one agent offers the model, by name (ordered, so requests are deterministic).
#[derive(Debug, Clone, Default)]
pub struct ToolSet {
    tools: BTreeMap<String, Tool>,
}

/// Tool names the model sees must be short identifiers (provider APIs enforce this).
pub fn is_valid_tool_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl ToolSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a tool.
    pub fn insert(&mut self, tool: Tool) {
        self.tools.insert(tool.name.clone(), tool);
    }

    pub fn remove(&mut self, name: &str) -> Option<Tool> {
        self.tools.remove(name)
    }

    pub fn get(&self, name: &str) -> Option<&Tool> {
        self.tools.get(name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tools.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    pub fn definitions(&self) -> Vec<ToolDefinition> {
        self.tools.values().map(Tool::definition).collect()
    }

    pub fn len(&self) -> usize {
        self.tools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}

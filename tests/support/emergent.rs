//! Test doubles for the emergent-capabilities tests: a scripted sandbox runner that
//! recognises a tiny fixed set of code strings (no JavaScript engine), judge verdict texts for
//! the scripted model, a shared event sink, host tools and request builders.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use async_trait::async_trait;
use crucible::agent::{AgentEvent, CancelFlag, CancelSignal, Environment, EventBody, EventSink, LocalTask, NativeEnvironment};
use crucible::model::{CallInfo, ChunkSink, Model, ModelChunk, ModelError, ModelRequest};
use crucible::registry::{EmergentConfig, Judges, Registry, RegistryDeps};
use crucible::sandbox::{SandboxFailure, SandboxRequest, SandboxResult, SandboxRunner, SandboxStatus};
use crucible::store::{BatchOp, MemoryStore, Store, StoreError, StoreLock};
use crucible::tools::{Tool, ToolSet};
use futures::executor::{block_on, LocalPool, LocalSpawner};
use futures::task::{LocalFutureObj, LocalSpawn};
use serde_json::{json, Value};

use super::{text, FnTool, Reply, ScriptedModel};

pub const SLUGIFY_JS: &str =
    "/*SLUGIFY*/ function execute(input) { return { slug: input.text.toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-|-$/g, '') }; }";
pub const SLUGIFY_V2_JS: &str = "/*SLUGIFY*/ /*v2*/ function execute(input) { return { slug: slug(input.text) }; }";
pub const ADD_JS: &str = "/*ADD*/ function execute(i) { return { sum: i.a + i.b }; }";
pub const WRONG_JS: &str = "/*WRONG*/ function execute() { return { slug: 'nope' }; }";
pub const SYNTAX_JS: &str = "/*SYNTAX*/ function execute( {";
pub const THROW_JS: &str = "/*THROW*/ function execute() { throw new Error('boom'); }";
/// Returns a slug of as many `a`s as its input text says (a large output from a small input).
pub const LARGE_JS: &str = "/*LARGE*/ function execute(input) { return { slug: 'a'.repeat(Number(input.text)) }; }";
pub const BADTYPE_JS: &str = "/*BADTYPE*/ function execute() { return { slug: 42 }; }";
/// Returns the slug itself instead of `{ slug }` (a small model's usual mistake).
pub const BARE_JS: &str = "/*BARE*/ function execute(input) { return slugOf(input.text); }";
/// Slugifies, except that the input text "42" gives a number: passes the slugify tests, then
/// breaks the output schema on that one later call.
pub const NUMBERS_JS: &str = "/*NUMBERS*/ function execute(input) { return { slug: input.text === '42' ? 42 : slugOf(input.text) }; }";
/// Slugifies correctly for its first five executions, wrongly after: passes its forge tests
/// and three uses, then fails the re-run of its tests before a promotion.
pub const DRIFTS_JS: &str = "/*DRIFTS*/ let calls = 0; function execute(input) { return { slug: ++calls > 5 ? 'drifted' : slugOf(input.text) }; }";

/// A test-double sandbox runner: evaluates the known code strings above by marker, records
/// every request.
#[derive(Default)]
pub struct ScriptedSandbox {
    pub requests: RefCell<Vec<SandboxRequest>>,
    /// While set, every execution is turned away (`queue_full`), as a pool with no room does.
    pub busy: std::cell::Cell<bool>,
}

fn slug(s: &str) -> String {
    let mut out = String::new();
    for c in s.to_lowercase().chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').to_string()
}

fn ok(v: Value) -> SandboxResult {
    SandboxResult { status: SandboxStatus::Ok, output: Some(v), error: None, logs: vec![], duration_ms: 0.1 }
}

fn fail(status: SandboxStatus, code: &str, message: &str) -> SandboxResult {
    SandboxResult { status, output: None, error: Some(SandboxFailure { code: code.into(), message: message.into() }), logs: vec![], duration_ms: 0.1 }
}

#[async_trait(?Send)]
impl SandboxRunner for ScriptedSandbox {
    async fn execute(&self, request: &SandboxRequest) -> SandboxResult {
        self.requests.borrow_mut().push(request.clone());
        let code = request.code.as_str();
        let input = &request.input;
        if self.busy.get() {
            fail(SandboxStatus::Error, "queue_full", "8 executions are already waiting for a sandbox worker (maxQueued 8); try again later")
        } else if code.contains("SLUGIFY") {
            ok(json!({ "slug": slug(input["text"].as_str().unwrap_or_default()) }))
        } else if code.contains("ADD") {
            ok(json!({ "sum": input["a"].as_f64().unwrap_or(0.0) + input["b"].as_f64().unwrap_or(0.0) }))
        } else if code.contains("WRONG") {
            ok(json!({ "slug": "nope" }))
        } else if code.contains("SYNTAX") {
            fail(SandboxStatus::Rejected, "syntax", "syntax error: unexpected token `{`")
        } else if code.contains("THROW") {
            fail(SandboxStatus::Error, "Error", "boom")
        } else if code.contains("BARE") {
            ok(json!(slug(input["text"].as_str().unwrap_or_default())))
        } else if code.contains("NUMBERS") {
            let text = input["text"].as_str().unwrap_or_default();
            ok(if text == "42" { json!({ "slug": 42 }) } else { json!({ "slug": slug(text) }) })
        } else if code.contains("DRIFTS") {
            let runs = self.requests.borrow().iter().filter(|r| r.code == request.code).count();
            ok(json!({ "slug": if runs > 5 { "drifted".to_string() } else { slug(input["text"].as_str().unwrap_or_default()) } }))
        } else if code.contains("BUSY") {
            fail(SandboxStatus::Error, "queue_full", "8 executions are already waiting for a sandbox worker (maxQueued 8); try again later")
        } else if code.contains("NESTED") {
            ok(json!({ "meta": { "slug": slug(input["text"].as_str().unwrap_or_default()), "lang": "en" } }))
        } else if code.contains("BADTYPE") {
            ok(json!({ "slug": 42 }))
        } else if code.contains("LARGE") {
            ok(json!({ "slug": "a".repeat(input["text"].as_str().and_then(|t| t.parse().ok()).unwrap_or(0)) }))
        } else {
            fail(SandboxStatus::Error, "unknown", "the scripted sandbox does not know this code")
        }
    }
}

/// A judge verdict as the model would write it.
pub fn verdict(approved: bool, correctness: f64, confidence: f64) -> String {
    format!(
        "Here is my review.\n```json\n{{\"approved\":{approved},\"safety\":0.95,\"correctness\":{correctness},\"determinism\":1,\"boundedness\":0.9,\"confidence\":{confidence},\"reasoning\":\"reviewed\"}}\n```"
    )
}

/// A judge that approves every tool with confidence 0.9.
pub fn approving_judge() -> Rc<ScriptedModel> {
    ScriptedModel::repeating(text(&verdict(true, 0.9, 0.9)))
}

/// A judge replying `replies` in order.
pub fn judge_replying(replies: Vec<Reply>) -> Rc<ScriptedModel> {
    ScriptedModel::new(replies)
}

/// A judge double whose first `stalls` answers write half a verdict and then never finish, as
/// a hung provider would; later ones are `then`'s.
pub struct StallingJudge {
    stalls: Cell<usize>,
    /// How many reviews it was asked for.
    pub asked: Cell<usize>,
    then: Rc<ScriptedModel>,
}

impl StallingJudge {
    pub fn new(stalls: usize, then: Rc<ScriptedModel>) -> Rc<Self> {
        Rc::new(Self { stalls: Cell::new(stalls), asked: Cell::new(0), then })
    }
}

#[async_trait(?Send)]
impl Model for StallingJudge {
    fn id(&self) -> String {
        "stalling:test".into()
    }

    async fn stream(&self, request: &ModelRequest, call: &CallInfo, sink: &mut dyn ChunkSink) -> Result<(), ModelError> {
        self.asked.set(self.asked.get() + 1);
        if self.stalls.get() == 0 {
            return self.then.stream(request, call, sink).await;
        }
        self.stalls.set(self.stalls.get() - 1);
        sink.chunk(&ModelChunk::Text { delta: "{\"approved\":true,\"safety\":".into() });
        std::future::pending().await
    }
}

/// A judge double that answers as `then` once its gate opens: a review the test lets finish
/// when it chooses.
pub struct GatedJudge {
    pub gate: CancelFlag,
    /// How many reviews it was asked for.
    pub asked: Cell<usize>,
    then: Rc<ScriptedModel>,
}

impl GatedJudge {
    pub fn new(then: Rc<ScriptedModel>) -> Rc<Self> {
        Rc::new(Self { gate: CancelFlag::default(), asked: Cell::new(0), then })
    }
}

#[async_trait(?Send)]
impl Model for GatedJudge {
    fn id(&self) -> String {
        "gated:test".into()
    }

    async fn stream(&self, request: &ModelRequest, call: &CallInfo, sink: &mut dyn ChunkSink) -> Result<(), ModelError> {
        self.asked.set(self.asked.get() + 1);
        self.gate.cancelled().await;
        self.then.stream(request, call, sink).await
    }
}

/// A native environment with a background executor the test drives: spawned tasks run only
/// in [`SpawningEnvironment::run_background`], as a host's event loop runs them after the
/// code that spawned them returned.
pub struct SpawningEnvironment {
    native: NativeEnvironment,
    pool: RefCell<LocalPool>,
    /// Apart from the pool: a task may spawn while the pool runs.
    spawner: LocalSpawner,
}

impl Default for SpawningEnvironment {
    fn default() -> Self {
        let pool = LocalPool::new();
        let spawner = pool.spawner();
        Self { native: NativeEnvironment::default(), pool: RefCell::new(pool), spawner }
    }
}

impl SpawningEnvironment {
    /// Runs the spawned tasks until none can make progress.
    pub fn run_background(&self) {
        self.pool.borrow_mut().run_until_stalled();
    }
}

impl Environment for SpawningEnvironment {
    fn now_ms(&self) -> f64 {
        self.native.now_ms()
    }

    fn elapsed_ms(&self) -> f64 {
        self.native.elapsed_ms()
    }

    fn new_id(&self, prefix: &str) -> String {
        self.native.new_id(prefix)
    }

    fn spawn_local(&self, task: LocalTask) -> Result<(), LocalTask> {
        self.spawner.spawn_local_obj(LocalFutureObj::new(task)).expect("the test pool is running");
        Ok(())
    }
}

/// Collects events into a shared vector.
#[derive(Clone, Default)]
pub struct SharedSink(pub Rc<RefCell<Vec<AgentEvent>>>);

impl EventSink for SharedSink {
    fn emit(&mut self, event: AgentEvent) {
        self.0.borrow_mut().push(event);
    }
}

impl SharedSink {
    /// The `type` tags of the collected events.
    pub fn types(&self) -> Vec<String> {
        self.0.borrow().iter().map(|e| serde_json::to_value(e).unwrap()["type"].as_str().unwrap().to_string()).collect()
    }

    pub fn bodies(&self) -> Vec<EventBody> {
        self.0.borrow().iter().map(|e| e.body.clone()).collect()
    }
}

/// Host tools: `upper_case` {text} → {text}, `word_count` {text} → {count}.
pub fn host_tools() -> ToolSet {
    let mut set = ToolSet::new();
    let text_in = json!({ "type": "object", "properties": { "text": { "type": "string" } }, "required": ["text"] });
    set.insert(
        Tool::new(
            "upper_case",
            "Upper-cases text",
            &text_in,
            Some(&json!({ "type": "object", "properties": { "text": { "type": "string" } }, "required": ["text"] })),
            FnTool::new(|a| Ok(json!({ "text": a["text"].as_str().unwrap_or_default().to_uppercase() }))),
        )
        .unwrap(),
    );
    set.insert(
        Tool::new(
            "word_count",
            "Counts words",
            &text_in,
            None,
            FnTool::new(|a| Ok(json!({ "count": a["text"].as_str().unwrap_or_default().split_whitespace().count() }))),
        )
        .unwrap(),
    );
    set
}

/// Everything a registry test needs, with handles on the doubles.
pub struct Rig {
    pub registry: Rc<Registry>,
    pub store: Rc<MemoryStore>,
    pub sandbox: Rc<ScriptedSandbox>,
    pub events: SharedSink,
}

/// A registry over `store` with the scripted sandbox, `judge` as creation judge and
/// `panel` as promotion judge, host tools set, events collected.
pub fn rig_with(config: EmergentConfig, judge: Option<Rc<ScriptedModel>>, panel: Option<Rc<ScriptedModel>>, store: Rc<MemoryStore>) -> Rig {
    rig_for("agent1", config, judge, panel, store)
}

/// [`rig_with`] for the agent `agent_id` (agents of one runtime share a store).
pub fn rig_for(agent_id: &str, config: EmergentConfig, judge: Option<Rc<ScriptedModel>>, panel: Option<Rc<ScriptedModel>>, store: Rc<MemoryStore>) -> Rig {
    rig_over(agent_id, config, judge, panel, store.clone(), store)
}

/// A rig whose registry reaches `memory` through `store` (a wrapper that changes timing).
pub fn rig_over(
    agent_id: &str,
    config: EmergentConfig,
    judge: Option<Rc<ScriptedModel>>,
    panel: Option<Rc<ScriptedModel>>,
    memory: Rc<MemoryStore>,
    store: Rc<dyn Store>,
) -> Rig {
    rig_of_models(agent_id, config, judge.map(|j| j as Rc<dyn Model>), panel.map(|j| j as Rc<dyn Model>), memory, store)
}

/// [`rig_over`] with any models as judge and panel (a [`StallingJudge`]).
pub fn rig_of_models(
    agent_id: &str,
    config: EmergentConfig,
    judge: Option<Rc<dyn Model>>,
    panel: Option<Rc<dyn Model>>,
    memory: Rc<MemoryStore>,
    store: Rc<dyn Store>,
) -> Rig {
    rig_in(Rc::new(NativeEnvironment::default()), agent_id, config, judge, panel, memory, store)
}

/// [`rig_of_models`] in `env` (a [`SpawningEnvironment`], for background work).
pub fn rig_in(
    env: Rc<dyn Environment>,
    agent_id: &str,
    config: EmergentConfig,
    judge: Option<Rc<dyn Model>>,
    panel: Option<Rc<dyn Model>>,
    memory: Rc<MemoryStore>,
    store: Rc<dyn Store>,
) -> Rig {
    let sandbox = Rc::new(ScriptedSandbox::default());
    let store_for_registry = store;
    let store = memory;
    let deps = RegistryDeps { store: store_for_registry, env, sandbox: Some(sandbox.clone()), judges: Judges { judge, promotion_judge: panel } };
    let registry = block_on(Registry::load(config, deps, agent_id)).unwrap();
    registry.set_host_tools(host_tools());
    let events = SharedSink::default();
    registry.set_event_sink(Box::new(events.clone()));
    Rig { registry, store, sandbox, events }
}

/// A rig with an approving judge and default config.
pub fn rig() -> Rig {
    rig_with(EmergentConfig::default(), Some(approving_judge()), Some(approving_judge()), Rc::new(MemoryStore::new()))
}

/// A correct sandbox `slugify` request named `name` with `code`.
pub fn slugify_request(name: &str, code: &str) -> Value {
    json!({
        "name": name,
        "description": "Turn text into a URL slug",
        "inputSchema": { "type": "object", "properties": { "text": { "type": "string" } }, "required": ["text"] },
        "outputSchema": { "type": "object", "properties": { "slug": { "type": "string" } }, "required": ["slug"] },
        "implementation": { "mode": "sandbox", "code": code },
        "testCases": [
            { "input": { "text": "Hello World!" }, "expectedOutput": { "slug": "hello-world" } },
            { "input": { "text": "Rust & Wasm" }, "expectedOutput": { "slug": "rust-wasm" } }
        ]
    })
}

/// A store over a [`MemoryStore`] as one shared by browser tabs behaves: reads answer after
/// yielding to the executor once, with the value as it was when asked (as IndexedDB and LevelDB
/// reads do, so concurrent flushes interleave between their reads and writes), and it has
/// named locks. It records locks, releases, reads and batches in order; `refuse_locks` makes
/// taking a lock fail. Its locks only record: they exclude nothing.
pub struct SharedDataStore {
    pub memory: Rc<MemoryStore>,
    pub log: Rc<RefCell<Vec<String>>>,
    pub refuse_locks: std::cell::Cell<bool>,
    /// Makes every batch fail with `store_quota`, writing nothing (a full IndexedDB).
    pub refuse_writes: std::cell::Cell<bool>,
    /// Reads of keys under this prefix wait at `gate` (a slow store).
    pub slow_reads: RefCell<Option<&'static str>>,
    /// The next batch waits at `gate`, then is refused with `store_quota` if `refuse_held`.
    pub hold_next_batch: std::cell::Cell<bool>,
    pub refuse_held: std::cell::Cell<bool>,
    pub gate: Gate,
}

impl SharedDataStore {
    pub fn new(memory: Rc<MemoryStore>) -> Self {
        Self {
            memory,
            log: Rc::default(),
            refuse_locks: Default::default(),
            refuse_writes: Default::default(),
            slow_reads: Default::default(),
            hold_next_batch: Default::default(),
            refuse_held: Default::default(),
            gate: Gate::default(),
        }
    }
}

/// Opens when the test says so; whoever waits at it waits until then.
#[derive(Default)]
pub struct Gate {
    open: std::cell::Cell<bool>,
    waiting: RefCell<Vec<std::task::Waker>>,
}

impl Gate {
    pub fn open(&self) {
        self.open.set(true);
        self.waiting.borrow_mut().drain(..).for_each(std::task::Waker::wake);
    }

    pub async fn pass(&self) {
        std::future::poll_fn(|cx| {
            if self.open.get() {
                return std::task::Poll::Ready(());
            }
            self.waiting.borrow_mut().push(cx.waker().clone());
            std::task::Poll::Pending
        })
        .await
    }
}

struct YieldOnce(bool);

impl std::future::Future for YieldOnce {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

#[async_trait(?Send)]
impl Store for SharedDataStore {
    async fn get(&self, key: &str) -> Result<Option<Value>, StoreError> {
        self.log.borrow_mut().push(format!("get {key}"));
        let slow = self.slow_reads.borrow().is_some_and(|prefix| key.starts_with(prefix));
        if slow {
            self.gate.pass().await;
        }
        let value = self.memory.get(key).await;
        YieldOnce(false).await;
        value
    }

    async fn put(&self, key: &str, value: Value) -> Result<(), StoreError> {
        self.memory.put(key, value).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.memory.delete(key).await
    }

    async fn scan(&self, prefix: &str) -> Result<Vec<(String, Value)>, StoreError> {
        self.memory.scan(prefix).await
    }

    async fn batch(&self, ops: Vec<BatchOp>) -> Result<(), StoreError> {
        self.log.borrow_mut().push("batch".into());
        if self.hold_next_batch.replace(false) {
            self.gate.pass().await;
            if self.refuse_held.get() {
                return Err(StoreError::new("store_quota", "the store is full"));
            }
        }
        if self.refuse_writes.get() {
            return Err(StoreError::new("store_quota", "the store is full"));
        }
        self.memory.batch(ops).await
    }

    async fn lock(&self, name: &str) -> Result<Option<StoreLock>, StoreError> {
        if self.refuse_locks.get() {
            return Err(StoreError::new("store_error", "the lock could not be taken"));
        }
        self.log.borrow_mut().push(format!("lock {name}"));
        let log = self.log.clone();
        let name = name.to_string();
        Ok(Some(StoreLock::new(move || log.borrow_mut().push(format!("release {name}")))))
    }

    /// A handle on `memory`'s data, as the agents of one runtime each hold one.
    fn data_key(&self) -> usize {
        self.memory.data_key()
    }
}

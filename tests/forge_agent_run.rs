//! `forge_tool` inside a full agent run: the scripted model forges a tool in turn 1, calls
//! the new tool in turn 2 (the registry is the agent's per-turn tool provider), then answers.

mod support;

use std::cell::RefCell;
use std::rc::Rc;

use crucible::agent::{Agent, AgentConfig, AgentError, ApprovalDecision, CancelFlag, CollectingSink, EventBody, NativeEnvironment, RunOptions, ToolProvider};
use crucible::forge::RejectionCategory;
use crucible::model::{CallInfo, ChunkSink, Message, Model, ModelError, ModelRequest};
use crucible::registry::EmergentConfig;
use crucible::store::{BatchOp, MemoryStore, Store, StoreError};
use crucible::tools::Tool;
use futures::executor::block_on;
use serde_json::{json, Value};
use support::emergent::*;
use support::{call, calls, text, FnTool, NeedsApproval, ScriptedModel};

fn agent_with_registry(model: Rc<ScriptedModel>, rig: &Rig) -> Agent {
    let agent = Agent::new(AgentConfig::default(), model, host_tools(), Rc::new(NativeEnvironment::default())).unwrap();
    agent.set_tool_provider(Some(rig.registry.clone() as Rc<dyn ToolProvider>));
    agent
}

fn tool_result_text(model: &ScriptedModel, request: usize) -> String {
    let requests = model.requests.borrow();
    let Message::Tool { content, .. } = requests[request].messages.last().unwrap() else { panic!("no tool result") };
    content.clone()
}

fn tool_result(model: &ScriptedModel, request: usize) -> Value {
    serde_json::from_str(&tool_result_text(model, request)).unwrap()
}

/// Every tool result the model was sent in request `request` (one step's parallel calls).
fn tool_results(model: &ScriptedModel, request: usize) -> Vec<Value> {
    model.requests.borrow()[request]
        .messages
        .iter()
        .filter_map(|m| match m {
            Message::Tool { content, .. } => Some(serde_json::from_str(content).unwrap()),
            _ => None,
        })
        .collect()
}

/// The local model's chat template (`scripts/model/qwen-tools.jinja`) recognizes a created
/// tool by these substrings of the compact `forge_tool` result, and then keeps the tools in
/// the prompt (call the new tool) instead of asking for the final answer; a rejection must not
/// match them. It reads the new tool's name from the first `"name":"`, which must be the
/// result's own `name`.
fn assert_template_markers(text: &str, ready: bool) {
    let matches = text.contains("\"success\":true") && text.contains("Call it by name");
    assert_eq!(matches, ready, "the forge_tool result {text}");
    if ready {
        let name = serde_json::from_str::<Value>(text).unwrap()["name"].as_str().unwrap().to_owned();
        assert!(text.starts_with(&format!(r#"{{"success":true,"name":"{name}""#)), "the forge_tool result {text}");
    }
}

#[test]
fn a_model_forges_a_tool_then_calls_it_next_turn_then_answers() {
    let r = rig();
    let forge_args = slugify_request("slugify", SLUGIFY_JS).to_string();
    let model = ScriptedModel::new(vec![call("forge_tool", &forge_args), call("slugify", r#"{"text":"Hello World!"}"#), text("The slug is hello-world.")]);
    let agent = agent_with_registry(model.clone(), &r);
    let mut sink = CollectingSink::default();
    let out = block_on(agent.run("Make a slug of 'Hello World!'", RunOptions { session_id: Some("s1".into()), ..Default::default() }, &mut sink)).unwrap();
    assert_eq!(out.text, "The slug is hello-world.");

    let requests = model.requests.borrow();
    let names = |i: usize| requests[i].tools.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
    assert!(names(0).contains(&"forge_tool".to_string()) && !names(0).contains(&"slugify".to_string()));
    assert!(names(1).contains(&"slugify".to_string()), "the forged tool is offered in the next turn");
    drop(requests);
    let forged = tool_result(&model, 1);
    assert_template_markers(&tool_result_text(&model, 1), true);
    assert_eq!(forged["success"], true);
    assert_eq!(forged["name"], "slugify");
    assert_eq!(tool_result(&model, 2), json!({ "slug": "hello-world" }));

    // The loop saw two successful tool executions; the registry emitted the forge events
    // carrying the run id.
    let ends = sink.events.iter().filter(|e| matches!(e.body, EventBody::ToolExecuteEnd { .. })).count();
    assert_eq!(ends, 2);
    assert_eq!(r.events.types(), ["forge.start", "forge.test", "forge.test", "forge.judge", "forge.registered"]);
    assert!(r.events.0.borrow().iter().all(|e| e.run_id == out.run_id));
    assert_eq!(r.registry.list("s1")[0].stats.calls, 1, "calls from the loop are counted");
}

#[test]
fn a_rejected_forge_is_a_readable_tool_result_so_the_model_can_retry() {
    let r = rig();
    let mut bad = slugify_request("slugify", SLUGIFY_JS);
    bad["testCases"].as_array_mut().unwrap().pop();
    let model =
        ScriptedModel::new(vec![call("forge_tool", &bad.to_string()), call("forge_tool", &slugify_request("slugify", SLUGIFY_JS).to_string()), text("done")]);
    let agent = agent_with_registry(model.clone(), &r);
    let mut sink = CollectingSink::default();
    block_on(agent.run("?", RunOptions { session_id: Some("s1".into()), ..Default::default() }, &mut sink)).unwrap();
    let first = tool_result(&model, 1);
    assert_template_markers(&tool_result_text(&model, 1), false);
    assert_eq!(first["success"], false);
    assert_eq!(first["category"], "shape_check");
    assert!(first["reason"].as_str().unwrap().contains("at least 2"));
    assert!(!sink.events.iter().any(|e| matches!(e.body, EventBody::ToolExecuteError { .. })), "a bad request is not a tool failure");
    assert_eq!(tool_result(&model, 2)["success"], true);
    let stats = r.registry.stats();
    assert_eq!((stats.attempts, stats.approved, stats.rejected, stats.unique_terminal_rejections), (2, 1, 1, 0));
}

#[test]
fn messy_small_model_arguments_still_forge() {
    let r = rig();
    // Stringified schemas, a mode synonym, flat-ish tests under `tests` with `expected`.
    let messy = json!({
        "name": "slugify",
        "inputSchema": "{\"type\":\"object\",\"properties\":{\"text\":{\"type\":\"string\"}}}",
        "outputSchema": "{\"type\":\"object\",\"properties\":{\"slug\":{\"type\":\"string\"}}}",
        "implementation": { "mode": "javascript", "code": SLUGIFY_JS },
        "tests": [{ "input": { "text": "A B" }, "expected": { "slug": "a-b" } }, { "input": { "text": "C" }, "expected": { "slug": "c" } }]
    });
    let model = ScriptedModel::new(vec![call("forge_tool", &messy.to_string()), text("ok")]);
    let agent = agent_with_registry(model.clone(), &r);
    block_on(agent.run("?", RunOptions { session_id: Some("s1".into()), ..Default::default() }, &mut CollectingSink::default())).unwrap();
    assert_eq!(tool_result(&model, 1)["success"], true, "{}", tool_result(&model, 1));
}

#[test]
fn forge_tool_arguments_under_synonyms_reach_normalization() {
    // `tool_name` and a request wrapped in `{"tool": …}` are shapes `normalize` repairs; the
    // meta-tool must not bounce them first with a schema check of its own.
    let r = rig();
    let mut renamed = slugify_request("slugify", SLUGIFY_JS);
    let name = renamed.as_object_mut().unwrap().remove("name").unwrap();
    renamed["tool_name"] = name;
    let wrapped = json!({ "tool": slugify_request("slug_wrapped", SLUGIFY_JS) });
    let model = ScriptedModel::new(vec![call("forge_tool", &renamed.to_string()), call("forge_tool", &wrapped.to_string()), text("ok")]);
    let agent = agent_with_registry(model.clone(), &r);
    block_on(agent.run("?", RunOptions { session_id: Some("s1".into()), ..Default::default() }, &mut CollectingSink::default())).unwrap();
    assert_eq!(tool_result(&model, 1)["name"], "slugify", "{}", tool_result(&model, 1));
    assert_eq!(tool_result(&model, 2)["name"], "slug_wrapped", "{}", tool_result(&model, 2));
}

#[test]
fn garbled_forge_tool_arguments_are_a_counted_parse_error_rejection() {
    let r = rig();
    // Cut-off JSON (a model that hit its token limit) and a request without a name.
    let cut_off = &slugify_request("slugify", SLUGIFY_JS).to_string()[..80];
    let nameless = json!({ "description": "no name", "testCases": 5 }).to_string();
    let model = ScriptedModel::new(vec![call("forge_tool", cut_off), call("forge_tool", &nameless), text("gave up")]);
    let agent = agent_with_registry(model.clone(), &r);
    let mut sink = CollectingSink::default();
    let out = block_on(agent.run("?", RunOptions { session_id: Some("s1".into()), ..Default::default() }, &mut sink)).unwrap();
    assert_eq!(out.text, "gave up", "the run goes on");

    let first = tool_result(&model, 1);
    assert_eq!((first["success"].clone(), first["category"].clone()), (json!(false), json!("parse_error")), "{first}");
    assert!(first["reason"].as_str().unwrap().contains("not valid JSON"), "{first}");
    let second = tool_result(&model, 2);
    assert_eq!(second["category"], "parse_error", "{second}");
    assert!(second["reason"].as_str().unwrap().contains("missing `name`"), "{second}");
    assert!(!sink.events.iter().any(|e| matches!(e.body, EventBody::ToolExecuteError { .. })), "a bad request is not a tool failure");

    let stats = r.registry.stats();
    assert_eq!((stats.attempts, stats.rejected, stats.rejections_by_category["parse_error"]), (2, 2, 2));
    assert_eq!(r.events.types(), ["forge.rejected", "forge.rejected"]);
    let audit = r.registry.audit_trail();
    assert_eq!(audit.iter().filter(|e| e.action == "reject").count(), 2, "both attempts are in the audit trail");
}

#[test]
fn forge_tool_arguments_far_past_the_request_bound_are_a_shape_check_rejection_unread() {
    let r = rig();
    // 3 MB of small test values: parsed, many times that in memory, only to be refused.
    let mut huge = slugify_request("slugify", SLUGIFY_JS);
    huge["testCases"][0]["input"]["extra"] = Value::Array(vec![json!({ "k": 1 }); 400_000]);
    let model = ScriptedModel::new(vec![call("forge_tool", &huge.to_string()), text("gave up")]);
    let agent = agent_with_registry(model.clone(), &r);
    let out = block_on(agent.run("?", RunOptions { session_id: Some("s1".into()), ..Default::default() }, &mut CollectingSink::default())).unwrap();
    assert_eq!(out.text, "gave up", "the run goes on");
    let result = tool_result(&model, 1);
    assert_eq!((result["success"].clone(), result["category"].clone()), (json!(false), json!("shape_check")), "{result}");
    assert!(result["reason"].as_str().unwrap().contains("characters of JSON text; at most 2097152 are read"), "{result}");
    let stats = r.registry.stats();
    assert_eq!((stats.attempts, stats.rejections_by_category["shape_check"]), (1, 1));
    // The same request as text through the API: the same rejection.
    let res = block_on(r.registry.forge(&Value::String(huge.to_string()), "s1"));
    assert_eq!(res.category, Some(RejectionCategory::ShapeCheck));
    assert!(res.reason.unwrap().contains("at most 2097152 are read"));
}

#[test]
fn a_runs_scope_tags_its_forge_attempts_and_a_resumed_run_keeps_it() {
    use crucible::agent::ApprovalDecision;
    use crucible::tools::Tool;
    use support::{FnTool, NeedsApproval};
    let r = rig();
    let mut own_scope = slugify_request("slug_b", SLUGIFY_JS);
    own_scope["scope"] = json!("own-label");
    let model = ScriptedModel::new(vec![
        call("forge_tool", &slugify_request("slug_a", SLUGIFY_JS).to_string()),
        call("forge_tool", &own_scope.to_string()),
        call("forge_tool", "{cut off"),
        call("guarded", "{}"),
        call("forge_tool", &slugify_request("slug_c", SLUGIFY_JS).to_string()),
        text("done"),
    ]);
    let mut tools = host_tools();
    let guarded = NeedsApproval { inner: FnTool::new(|_| Ok(json!({ "ok": true }))), predicate: Box::new(|_| true) };
    tools.insert(Tool::new("guarded", "Needs a human", &json!({ "type": "object" }), None, Rc::new(guarded)).unwrap());
    let agent = Agent::new(AgentConfig::default(), model, tools, Rc::new(NativeEnvironment::default())).unwrap();
    agent.set_tool_provider(Some(r.registry.clone() as Rc<dyn ToolProvider>));
    let options = RunOptions { session_id: Some("s1".into()), scope: Some("task-3".into()), ..Default::default() };
    let paused = block_on(agent.run("Make slugs", options, &mut CollectingSink::default())).unwrap();
    let approval = paused.pending_approvals[0].id.clone();
    let decision = ApprovalDecision { id: approval, approved: true, reason: None };
    // The state as a host keeps it, plain JSON, and resumed from it.
    let state = serde_json::from_value(serde_json::to_value(paused.state.unwrap()).unwrap()).unwrap();
    let done = block_on(agent.resume_state(state, &[decision], None, &mut CollectingSink::default())).unwrap();
    assert_eq!(done.text, "done");
    // Each attempt's outcome, with its scope: the run's, unless the request gives its own.
    let outcomes: Vec<(String, Value)> = r
        .events
        .bodies()
        .iter()
        .map(|b| serde_json::to_value(b).unwrap())
        .filter(|e| e["type"] == "forge.registered" || e["type"] == "forge.rejected")
        .map(|e| (e["name"].as_str().unwrap().to_string(), e["scope"].clone()))
        .collect();
    let expected = [("slug_a", "task-3"), ("slug_b", "own-label"), ("", "task-3"), ("slug_c", "task-3")];
    assert_eq!(outcomes, expected.map(|(n, s)| (n.to_string(), json!(s))));
    let starts = r.events.bodies().iter().filter(|b| matches!(b, EventBody::ForgeStart { scope: Some(s), .. } if s == "task-3")).count();
    assert_eq!(starts, 2, "slug_a and, after the resume, slug_c");
}

#[test]
fn a_forge_result_past_max_result_bytes_is_shortened_so_the_model_still_reads_the_outcome() {
    // 32 failing cases (the most a request may carry) list a reason longer than a small
    // `maxResultBytes`; a success's input schema with long descriptions does too. Refused as
    // `result_too_large`, the rejection would lose its reason and category, and the success
    // would read as a failure for a tool that is registered.
    let r = rig();
    let mut failing = slugify_request("slugify", WRONG_JS);
    failing["testCases"] =
        (0..32).map(|i| json!({ "input": { "text": format!("case {i} {}", "words ".repeat(25)) }, "expectedOutput": { "slug": format!("c{i}") } })).collect();
    let mut described = slugify_request("described", SLUGIFY_JS);
    described["inputSchema"]["properties"]["text"]["description"] = json!("The text to turn into a slug. ".repeat(80));
    let model = ScriptedModel::new(vec![
        call("forge_tool", &failing.to_string()),
        call("forge_tool", &described.to_string()),
        call("described", r#"{"text":"A B"}"#),
        text("done"),
    ]);
    let limit = 2048;
    let agent =
        Agent::new(AgentConfig { max_result_bytes: limit, ..AgentConfig::default() }, model.clone(), host_tools(), Rc::new(NativeEnvironment::default()))
            .unwrap();
    agent.set_tool_provider(Some(r.registry.clone() as Rc<dyn ToolProvider>));
    let mut sink = CollectingSink::default();
    block_on(agent.run("?", RunOptions { session_id: Some("s1".into()), ..Default::default() }, &mut sink)).unwrap();
    assert!(!sink.events.iter().any(|e| matches!(e.body, EventBody::ToolExecuteError { .. })), "neither result is refused as too large");

    let rejected = tool_result(&model, 1);
    assert!(tool_result_text(&model, 1).len() <= limit);
    assert_eq!((rejected["success"].clone(), rejected["category"].clone()), (json!(false), json!("other")), "{rejected}");
    assert!(rejected["reason"].as_str().unwrap().starts_with("32 of 32 tests failed: test 0"), "{rejected}");
    assert!(rejected["hint"].is_string());

    let forged = tool_result(&model, 2);
    assert!(tool_result_text(&model, 2).len() <= limit);
    assert_eq!((forged["success"].clone(), forged["name"].clone()), (json!(true), json!("described")), "{forged}");
    assert_template_markers(&tool_result_text(&model, 2), true);
    assert_eq!(tool_result(&model, 3), json!({ "slug": "a-b" }), "the tool was registered and the model called it");
}

#[test]
fn the_same_forge_twice_in_one_step_makes_one_version_as_it_does_in_two_steps() {
    // A model that sends one request twice in a step (small ones repeat calls) has both checked
    // at once; the one registered second is identical to the first and must get it unchanged,
    // not a second version of the same content that starts the tool's uses over.
    let r = rig();
    let request = slugify_request("slugify", SLUGIFY_JS).to_string();
    let model = ScriptedModel::new(vec![calls(&[("forge_tool", &request), ("forge_tool", &request)]), call("slugify", r#"{"text":"A B"}"#), text("done")]);
    let agent = agent_with_registry(model.clone(), &r);
    block_on(agent.run("?", RunOptions { session_id: Some("s1".into()), ..Default::default() }, &mut CollectingSink::default())).unwrap();

    let results = tool_results(&model, 1);
    assert_eq!(results.len(), 2);
    assert!(results.iter().all(|res| res["success"] == true && res["version"] == 1), "{results:?}");
    assert!(results[1]["message"].as_str().unwrap().contains("already exists exactly as requested"), "{}", results[1]);
    // The chat template asks for the tool's call after either (serde_json keeps the key order).
    results.iter().for_each(|res| assert_template_markers(&res.to_string(), true));
    let tools = r.registry.list("s1");
    assert_eq!((tools.len(), tools[0].version, tools[0].stats.calls), (1, 1, 1), "one version, and the call after counts for it");
    let stats = r.registry.stats();
    assert_eq!((stats.attempts, stats.approved), (1, 1), "one tool forged, as when the request comes again in the next step");
    let audit = r.registry.audit_trail();
    assert_eq!(audit.iter().filter(|e| e.action == "unchanged").count(), 1);
}

/// A store over a [`MemoryStore`] whose next batch, once `abort` is set, aborts that run (as
/// its host would) and then never answers: an IndexedDB write still pending when the user stops
/// the run.
#[derive(Default)]
struct AbortingStore {
    memory: Rc<MemoryStore>,
    abort: std::cell::RefCell<Option<Rc<CancelFlag>>>,
}

#[async_trait::async_trait(?Send)]
impl Store for AbortingStore {
    async fn get(&self, key: &str) -> Result<Option<Value>, StoreError> {
        self.memory.get(key).await
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
        let abort = self.abort.borrow_mut().take();
        if let Some(run) = abort {
            run.cancel();
            futures::future::pending::<()>().await;
        }
        self.memory.batch(ops).await
    }
}

#[test]
fn a_run_aborted_while_its_forge_is_written_leaves_the_forge_for_the_next_write() {
    // The abort drops the forge_tool call where it waits: on the store write of a forge already
    // registered in memory. Its audit entries and its name in the stats must still reach the
    // store with the next write, or a restart shows an agent with a tool nobody forged.
    let store = Rc::new(AbortingStore::default());
    let r = rig_over("agent1", EmergentConfig::default(), Some(approving_judge()), None, store.memory.clone(), store.clone());
    let model = ScriptedModel::new(vec![call("forge_tool", &slugify_request("slugify", SLUGIFY_JS).to_string()), text("never asked")]);
    let agent = agent_with_registry(model, &r);
    let cancel = Rc::new(CancelFlag::default());
    *store.abort.borrow_mut() = Some(cancel.clone());
    let options = RunOptions { session_id: Some("s1".into()), cancel: Some(cancel), ..Default::default() };
    let aborted = block_on(agent.run("Make a slug tool", options, &mut CollectingSink::default()));
    assert!(matches!(aborted, Err(AgentError::Aborted)), "{aborted:?}");
    assert_eq!(r.registry.list("s1").len(), 1, "the verdict was in: the tool is registered");

    assert!(block_on(r.registry.forge(&slugify_request("slug_two", SLUGIFY_JS), "s1")).success);
    r.registry.close();
    let restarted = rig_over("agent1", EmergentConfig::default(), Some(approving_judge()), None, store.memory.clone(), store.memory.clone());
    let forged: Vec<(String, String)> = restarted.registry.audit_trail().into_iter().filter(|e| e.action == "forge").map(|e| (e.action, e.tool)).collect();
    assert_eq!(forged, [("forge".to_string(), "slugify".to_string()), ("forge".to_string(), "slug_two".to_string())]);
    let stats = restarted.registry.stats();
    assert_eq!((stats.attempts, stats.approved, stats.unique_names), (2, 2, 2));
}

/// A judge whose review is aborted with its run: it aborts `run` (as the host's signal would,
/// shared by the run and the judge's request) and fails as an aborted request does.
struct AbortedJudge {
    run: RefCell<Option<Rc<CancelFlag>>>,
}

#[async_trait::async_trait(?Send)]
impl Model for AbortedJudge {
    fn id(&self) -> String {
        "aborted:judge".into()
    }

    async fn stream(&self, _: &ModelRequest, _: &CallInfo, _: &mut dyn ChunkSink) -> Result<(), ModelError> {
        if let Some(run) = self.run.borrow_mut().take() {
            run.cancel();
        }
        Err(ModelError::new("aborted", "This operation was aborted"))
    }
}

#[test]
fn a_forge_cut_short_by_the_runs_abort_is_not_a_rejection_of_the_request() {
    // An approved step runs to its end even when the resumed run is aborted (its results must
    // be saved): its forge_tool call's judge is aborted with the run. That is no verdict on the
    // request: it must not count or audit a rejection, nor tell the model to fix the request.
    let store = Rc::new(MemoryStore::new());
    let judge = Rc::new(AbortedJudge { run: RefCell::new(None) });
    let r = rig_of_models("agent1", EmergentConfig::default(), Some(judge.clone()), None, store.clone(), store.clone());
    let mut tools = host_tools();
    let refund = Rc::new(NeedsApproval { inner: FnTool::new(|_| Ok(json!({ "refunded": true }))), predicate: Box::new(|_| true) });
    tools.insert(Tool::new("refund", "Refunds an order", &json!({ "type": "object" }), None, refund).unwrap());
    let forge = slugify_request("slugify", SLUGIFY_JS).to_string();
    let model = ScriptedModel::new(vec![calls(&[("forge_tool", &forge), ("refund", r#"{"order":42}"#)]), text("never asked")]);
    let agent = Agent::new(AgentConfig::default(), model, tools, Rc::new(NativeEnvironment::default())).unwrap().with_store(store.clone(), "agent1");
    agent.set_tool_provider(Some(r.registry.clone() as Rc<dyn ToolProvider>));
    let options = RunOptions { session_id: Some("s1".into()), ..Default::default() };
    let paused = block_on(agent.run("Refund order 42 and make a slug tool", options, &mut CollectingSink::default())).unwrap();
    let approve = [ApprovalDecision { id: paused.pending_approvals[0].id.clone(), approved: true, reason: None }];
    let cancel = Rc::new(CancelFlag::default());
    *judge.run.borrow_mut() = Some(cancel.clone());
    let mut sink = CollectingSink::default();
    let resumed = block_on(agent.resume(&paused.run_id, &approve, Some(cancel), &mut sink));
    assert!(matches!(resumed, Err(AgentError::Aborted)), "{resumed:?}");

    let stats = r.registry.stats();
    assert_eq!((stats.attempts, stats.rejected, stats.unique_terminal_rejections), (0, 0, 0), "{stats:?}");
    assert!(!r.registry.audit_trail().iter().any(|e| e.action == "reject"));
    assert!(!r.events.types().contains(&"forge.rejected".to_string()), "{:?}", r.events.types());
    let failed = sink.events.iter().find_map(|e| match &e.body {
        EventBody::ToolExecuteError { name, error, .. } if name == "forge_tool" => Some(error.clone()),
        _ => None,
    });
    assert_eq!(failed.map(|f| f.code), Some("aborted".to_string()));
    // What the model reads when the run is resumed: the forge was cut short, the refund done.
    let saved = block_on(agent.load_run(&paused.run_id)).unwrap();
    let results: Vec<(String, String)> = saved
        .messages
        .iter()
        .filter_map(|m| match m {
            Message::Tool { name, content, .. } => Some((name.clone(), content.clone())),
            _ => None,
        })
        .collect();
    assert!(results[0].1.contains("\"code\":\"aborted\"") && results[0].1.contains("call forge_tool again"), "{results:?}");
    assert_eq!(results[1], ("refund".to_string(), r#"{"refunded":true}"#.to_string()));
}

#[test]
fn two_different_forges_of_one_name_in_one_step_register_the_first_and_refuse_the_second() {
    // Both are checked at once; the one registered second was checked against the session as
    // it was before the first, and replacing it would leave the model told of two tools where
    // it has one, not knowing which its next call reaches.
    let r = rig();
    let (first, second) = (slugify_request("slugify", SLUGIFY_JS).to_string(), slugify_request("slugify", SLUGIFY_V2_JS).to_string());
    let model = ScriptedModel::new(vec![calls(&[("forge_tool", &first), ("forge_tool", &second)]), call("slugify", r#"{"text":"A B"}"#), text("done")]);
    let agent = agent_with_registry(model.clone(), &r);
    block_on(agent.run("?", RunOptions { session_id: Some("s1".into()), ..Default::default() }, &mut CollectingSink::default())).unwrap();

    let results = tool_results(&model, 1);
    assert_eq!((results[0]["success"].clone(), results[0]["version"].clone()), (json!(true), json!(1)), "{results:?}");
    assert_eq!((results[1]["success"].clone(), results[1]["category"].clone()), (json!(false), json!("other")), "{results:?}");
    let reason = results[1]["reason"].as_str().unwrap();
    assert!(reason.contains("another forge or import registered `slugify` v1 in this session while this one was checked"), "{reason}");
    assert_eq!(tool_result(&model, 2), json!({ "slug": "a-b" }), "the model's next call reaches the tool it was told of");
    let tools = r.registry.list("s1");
    assert_eq!((tools.len(), tools[0].version), (1, 1), "nothing replaced it");
    let stats = r.registry.stats();
    assert_eq!((stats.attempts, stats.approved, stats.rejected), (2, 1, 1));
    assert!(r.registry.audit_trail().iter().any(|e| e.action == "reject" && e.detail.contains("registered `slugify` v1")));
    // In a later step the model forges knowing what is there: a different request replaces it.
    assert_eq!(block_on(r.registry.forge(&slugify_request("slugify", SLUGIFY_V2_JS), "s1")).tool.map(|t| t.version), Some(2));
}

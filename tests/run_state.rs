//! Durable runs: approval pauses, resume (from the returned state or the store), denials fed
//! back to the model, and recovery of a run interrupted between steps.

mod support;

use std::rc::Rc;

use crucible::agent::{
    Agent, AgentConfig, AgentError, ApprovalDecision, CancelFlag, CancelSignal, CollectingSink, EventBody, HistoryLimits, NativeEnvironment, RunOptions,
    RunStatus, StoredRunStatus,
};
use crucible::model::{Message, ModelError};
use crucible::store::{MemoryStore, Store};
use crucible::tools::{Tool, ToolSet};
use futures::executor::block_on;
use serde_json::{json, Value};
use support::*;

fn refund_agent(model: Rc<ScriptedModel>, refunds: Rc<FnTool>, store: Rc<MemoryStore>) -> Agent {
    refund_agent_with(AgentConfig::default(), model, refunds, store)
}

fn refund_agent_with(config: AgentConfig, model: Rc<ScriptedModel>, refunds: Rc<FnTool>, store: Rc<MemoryStore>) -> Agent {
    refund_agent_without_store(config, model, refunds).with_store(store, "support-bot")
}

/// An agent that resumes the states it is handed as they are (no store to check them against).
fn refund_agent_without_store(config: AgentConfig, model: Rc<ScriptedModel>, refunds: Rc<FnTool>) -> Agent {
    let handler = Rc::new(NeedsApproval { inner: refunds, predicate: Box::new(|args: &Value| args["amount"].as_f64().unwrap_or(0.0) > 10.0) });
    let mut tools = ToolSet::new();
    tools.insert(
        Tool::new(
            "refund",
            "Refund an order",
            &json!({ "type": "object", "properties": { "order": { "type": "integer" }, "amount": { "type": "number" } }, "required": ["order", "amount"] }),
            None,
            handler,
        )
        .unwrap(),
    );
    Agent::new(config, model, tools, Rc::new(NativeEnvironment::default())).unwrap()
}

fn refund_tool() -> Rc<FnTool> {
    FnTool::new(|args| Ok(json!({ "refunded": args["order"] })))
}

#[test]
fn arguments_nested_too_deep_to_store_are_refused_and_never_wait_for_approval() {
    // 100 levels: serde_json reads it, but inside a stored run state it would pass 128. 200
    // levels: well-formed JSON serde_json stops reading, said as depth all the same.
    for levels in [100, 200] {
        let store = Rc::new(MemoryStore::new());
        let refunds = refund_tool();
        let deep = format!(r#"{{"order":42,"amount":99,"note":{}1{}}}"#, "[".repeat(levels), "]".repeat(levels));
        let model = ScriptedModel::new(vec![call("refund", &deep), text("Could not.")]);
        let agent = refund_agent(model, refunds.clone(), store);
        let mut sink = CollectingSink::default();
        let out = block_on(agent.run("refund 42", RunOptions::default(), &mut sink)).unwrap();
        assert_eq!(out.status, RunStatus::Completed, "not paused");
        let error = sink.events.iter().find_map(|e| match &e.body {
            EventBody::ToolExecuteError { error, .. } => Some(error.clone()),
            _ => None,
        });
        let expected = ("invalid_arguments".to_string(), "arguments nest more than 64 levels deep".to_string());
        assert_eq!(error.map(|e| (e.code, e.message)), Some(expected), "{levels} levels");
        assert_eq!(refunds.calls.get(), 0, "the refund never ran");
    }
}

#[test]
fn arguments_the_input_schema_refuses_fail_the_call_without_asking_anyone() {
    let store = Rc::new(MemoryStore::new());
    let refunds = refund_tool();
    // "forty-two" is no integer; 99 would otherwise need approval (over 10).
    let model = ScriptedModel::new(vec![call("refund", r#"{"order":"forty-two","amount":99}"#), text("Could not.")]);
    let agent = refund_agent(model, refunds.clone(), store);
    let mut sink = CollectingSink::default();
    let out = block_on(agent.run("refund 42", RunOptions::default(), &mut sink)).unwrap();
    assert_eq!((out.status, out.pending_approvals.len()), (RunStatus::Completed, 0), "not paused for a call that cannot run");
    assert!(!sink.events.iter().any(|e| matches!(e.body, EventBody::ApprovalRequested { .. })));
    let error = sink.events.iter().find_map(|e| match &e.body {
        EventBody::ToolExecuteError { error, .. } => Some(error.code.clone()),
        _ => None,
    });
    assert_eq!(error.as_deref(), Some("invalid_arguments"));
    assert_eq!(refunds.calls.get(), 0);
}

#[test]
fn stored_runs_lists_what_the_store_holds_and_discard_run_removes_it() {
    let store = Rc::new(MemoryStore::new());
    let model = ScriptedModel::new(vec![call("refund", r#"{"order":42,"amount":99}"#)]);
    let agent = refund_agent(model, refund_tool(), store.clone());
    let mut sink = CollectingSink::default();
    let out = block_on(agent.run("refund 42", RunOptions::default(), &mut sink)).unwrap();
    assert_eq!(out.status, RunStatus::Paused);
    // A record this build does not read is left out of the list, not an error.
    block_on(store.put("agent/support-bot/run/other", json!({ "kind": "run", "v": 99, "data": {} }))).unwrap();
    let stored = block_on(agent.stored_runs()).unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!((stored[0].run_id.as_str(), stored[0].status, stored[0].pending_approvals.len()), (out.run_id.as_str(), StoredRunStatus::Paused, 1));

    assert!(block_on(agent.discard_run(&out.run_id)).unwrap());
    assert!(!block_on(agent.discard_run(&out.run_id)).unwrap(), "nothing left");
    assert!(block_on(agent.stored_runs()).unwrap().is_empty());
    let err = block_on(agent.resume(&out.run_id, &[], None, &mut sink)).unwrap_err();
    assert!(matches!(err, AgentError::InvalidResume(_)), "{err}");
}

#[test]
fn a_call_needing_approval_pauses_before_executing_and_persists_the_state() {
    let store = Rc::new(MemoryStore::new());
    let refunds = refund_tool();
    let model = ScriptedModel::new(vec![call("refund", r#"{"order":42,"amount":99}"#)]);
    let agent = refund_agent(model, refunds.clone(), store.clone());
    let mut sink = CollectingSink::default();
    let out = block_on(agent.run("Refund order 42", RunOptions::default(), &mut sink)).unwrap();
    assert_eq!(out.status, RunStatus::Paused);
    assert_eq!(refunds.calls.get(), 0, "nothing executes before the decision");
    assert_eq!(out.pending_approvals.len(), 1);
    assert_eq!(out.pending_approvals[0].tool, "refund");
    assert_eq!(out.pending_approvals[0].arguments, Some(json!({ "order": 42, "amount": 99 })));
    assert_eq!(out.pending_approvals[0].kind, "tool_call");
    assert!(matches!(sink.events.last().unwrap().body, EventBody::AgentPaused { .. }));
    assert!(sink.events.iter().any(|e| matches!(&e.body, EventBody::ApprovalRequested { approval } if approval.tool == "refund")));
    // The state is plain JSON and is in the store.
    let state_json = serde_json::to_value(out.state.as_ref().unwrap()).unwrap();
    assert!(state_json["pending"]["calls"].is_array());
    let persisted = block_on(store.get(&format!("agent/support-bot/run/{}", out.run_id))).unwrap().unwrap();
    assert_eq!(persisted["kind"], "run");
    assert_eq!(persisted["v"], 1);
}

#[test]
fn an_approved_call_runs_after_resume_in_a_fresh_agent_sharing_only_the_store() {
    let store = Rc::new(MemoryStore::new());
    let first = refund_agent(ScriptedModel::new(vec![call("refund", r#"{"order":42,"amount":99}"#)]), refund_tool(), store.clone());
    let paused = block_on(first.run("Refund order 42", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    drop(first);

    // "Another process": a new agent over the same store, resuming by run id.
    let refunds = refund_tool();
    let model = ScriptedModel::new(vec![text("Refunded order 42.")]);
    let second = refund_agent(model.clone(), refunds.clone(), store.clone());
    let approval = &paused.pending_approvals[0];
    let mut sink = CollectingSink::default();
    let out = block_on(second.resume(&paused.run_id, &[ApprovalDecision { id: approval.id.clone(), approved: true, reason: None }], None, &mut sink)).unwrap();
    assert_eq!(out.status, RunStatus::Completed);
    assert_eq!(out.text, "Refunded order 42.");
    assert_eq!(refunds.calls.get(), 1);
    assert!(sink.events.iter().any(|e| matches!(&e.body, EventBody::ToolExecuteEnd { result, .. } if result == &json!({ "refunded": 42 }))));
    // The model saw the original question and the tool result.
    let seen = &model.requests.borrow()[0].messages;
    assert!(seen.iter().any(|m| matches!(m, Message::User { content } if content == "Refund order 42")));
    assert!(matches!(seen.last().unwrap(), Message::Tool { content, .. } if content.contains("refunded")));
    assert!(block_on(store.get(&format!("agent/support-bot/run/{}", out.run_id))).unwrap().is_none(), "a completed run leaves no state behind");
}

#[test]
fn a_denied_call_is_fed_back_to_the_model_with_the_reason() {
    let store = Rc::new(MemoryStore::new());
    let refunds = refund_tool();
    let model = ScriptedModel::new(vec![call("refund", r#"{"order":42,"amount":99}"#), text("I could not refund it.")]);
    let agent = refund_agent(model.clone(), refunds.clone(), store);
    let paused = block_on(agent.run("Refund", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    let id = paused.pending_approvals[0].id.clone();
    let mut sink = CollectingSink::default();
    let out = block_on(agent.resume_state(
        paused.state.unwrap(),
        &[ApprovalDecision { id, approved: false, reason: Some("over the limit".into()) }],
        None,
        &mut sink,
    ))
    .unwrap();
    assert_eq!(out.text, "I could not refund it.");
    assert_eq!(refunds.calls.get(), 0);
    let Message::Tool { content, .. } = model.requests.borrow()[1].messages.last().unwrap().clone() else { panic!() };
    assert!(content.contains("denied") && content.contains("over the limit"), "{content}");
}

#[test]
fn calls_not_needing_approval_in_the_same_step_wait_and_then_run_in_call_order() {
    let store = Rc::new(MemoryStore::new());
    let refunds = refund_tool();
    let model = ScriptedModel::new(vec![calls(&[("refund", r#"{"order":1,"amount":5}"#), ("refund", r#"{"order":2,"amount":50}"#)]), text("done")]);
    let agent = refund_agent(model, refunds.clone(), store);
    let paused = block_on(agent.run("two refunds", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    assert_eq!(paused.pending_approvals.len(), 1, "only the large refund needs approval");
    assert_eq!(refunds.calls.get(), 0, "the whole step waits");
    let id = paused.pending_approvals[0].id.clone();
    let out = block_on(agent.resume(&paused.run_id, &[ApprovalDecision { id, approved: true, reason: None }], None, &mut CollectingSink::default())).unwrap();
    assert_eq!(out.status, RunStatus::Completed);
    assert_eq!(*refunds.finished_order.borrow(), ["call_0", "call_1"]);
}

#[test]
fn resuming_without_a_decision_or_with_an_unknown_id_is_a_typed_error() {
    let store = Rc::new(MemoryStore::new());
    let agent = refund_agent(ScriptedModel::new(vec![call("refund", r#"{"order":42,"amount":99}"#)]), refund_tool(), store);
    let paused = block_on(agent.run("Refund", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    let err = block_on(agent.resume(&paused.run_id, &[], None, &mut CollectingSink::default())).unwrap_err();
    assert_eq!(err.code(), "invalid_resume");
    let err =
        block_on(agent.resume(&paused.run_id, &[ApprovalDecision { id: "nope".into(), approved: true, reason: None }], None, &mut CollectingSink::default()))
            .unwrap_err();
    assert!(matches!(err, AgentError::InvalidResume(_)));
    let err = block_on(agent.resume("run_unknown", &[], None, &mut CollectingSink::default())).unwrap_err();
    assert_eq!(err.code(), "invalid_resume");
}

#[test]
fn a_run_interrupted_between_steps_resumes_from_its_last_persisted_step() {
    let store = Rc::new(MemoryStore::new());
    let refunds = refund_tool();
    // The first "process" dies after the first step: its model fails on turn 2.
    let model = ScriptedModel::new(vec![call("refund", r#"{"order":7,"amount":1}"#)]);
    let agent = refund_agent(model, refunds.clone(), store.clone());
    let err =
        block_on(agent.run("small refund", RunOptions { run_id: Some("run_crash".into()), ..Default::default() }, &mut CollectingSink::default())).unwrap_err();
    assert_eq!(err.code(), "provider_protocol");
    assert_eq!(refunds.calls.get(), 1);

    // Resumed where the model fails again at once: nothing moved, so it can be resumed again,
    // here, and it goes on from the same step.
    let model = ScriptedModel::new(vec![]);
    let restarted = refund_agent(model, refunds.clone(), store.clone());
    assert_eq!(block_on(restarted.resume("run_crash", &[], None, &mut CollectingSink::default())).unwrap_err().code(), "provider_protocol");
    let model = ScriptedModel::new(vec![text("Refunded order 7.")]);
    let restarted = refund_agent(model.clone(), refunds.clone(), store);
    let out = block_on(restarted.resume("run_crash", &[], None, &mut CollectingSink::default())).unwrap();
    assert_eq!(out.text, "Refunded order 7.");
    assert_eq!(refunds.calls.get(), 1, "the persisted step is not executed twice");
    assert_eq!((out.turns, out.steps), (2, 1));
}

#[test]
fn a_call_needing_approval_on_the_last_turn_is_not_put_to_anyone() {
    let store = Rc::new(MemoryStore::new());
    let refunds = refund_tool();
    let config = AgentConfig { max_turns: 1, ..AgentConfig::default() };
    let agent = refund_agent_with(config, ScriptedModel::repeating(call("refund", r#"{"order":42,"amount":99}"#)), refunds.clone(), store.clone());
    let mut sink = CollectingSink::default();
    let err = block_on(agent.run("Refund order 42", RunOptions::default(), &mut sink)).unwrap_err();
    assert_eq!(err, AgentError::MaxTurnsExceeded { max: 1, calls_not_run: 1 });
    assert!(!sink.events.iter().any(|e| matches!(e.body, EventBody::ApprovalRequested { .. })), "no approval is asked for a call that cannot matter");
    assert_eq!(refunds.calls.get(), 0);
    assert!(block_on(store.scan("agent/support-bot/run/")).unwrap().is_empty(), "nothing is left to resume");
}

#[test]
fn a_step_paused_on_what_is_now_the_last_turn_is_not_run_on_resume() {
    let store = Rc::new(MemoryStore::new());
    let refunds = refund_tool();
    let (_, paused, decisions) = paused_refund(Some(store.clone()), refunds.clone());
    // The run paused on its first turn; the agent that resumes it allows one turn only.
    let config = AgentConfig { max_turns: 1, ..AgentConfig::default() };
    let strict = refund_agent_with(config, ScriptedModel::repeating(text("Refunded.")), refunds.clone(), store.clone());
    let mut sink = CollectingSink::default();
    let err = block_on(strict.resume(&paused.run_id, &decisions, None, &mut sink)).unwrap_err();
    assert_eq!(err, AgentError::MaxTurnsExceeded { max: 1, calls_not_run: 1 });
    assert_eq!(refunds.calls.get(), 0, "the approved refund could never reach the model: it does not run");
    assert!(!sink.events.iter().any(|e| matches!(e.body, EventBody::ToolExecuteStart { .. })));
    assert!(block_on(store.scan("agent/support-bot/run/")).unwrap().is_empty());
}

/// A paused refund of 99 (approval needed) over `store`, with the agent that will resume it.
fn paused_refund(store: Option<Rc<MemoryStore>>, refunds: Rc<FnTool>) -> (Agent, crucible::agent::RunOutput, Vec<ApprovalDecision>) {
    let agent = match store {
        Some(store) => {
            refund_agent(ScriptedModel::new(vec![call("refund", r#"{"order":42,"amount":99}"#), text("Refunded."), text("Refunded.")]), refunds, store)
        }
        None => {
            let handler = Rc::new(NeedsApproval { inner: refunds, predicate: Box::new(|_: &Value| true) });
            let mut tools = ToolSet::new();
            tools.insert(Tool::new("refund", "Refund an order", &json!({ "type": "object" }), None, handler).unwrap());
            let model = ScriptedModel::new(vec![call("refund", r#"{"order":42,"amount":99}"#), text("Refunded."), text("Refunded.")]);
            Agent::new(AgentConfig::default(), model, tools, Rc::new(NativeEnvironment::default())).unwrap()
        }
    };
    let paused = block_on(agent.run("Refund order 42", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    let decisions = vec![ApprovalDecision { id: paused.pending_approvals[0].id.clone(), approved: true, reason: None }];
    (agent, paused, decisions)
}

#[test]
fn a_paused_run_resumes_once_so_its_approved_call_runs_once() {
    let store = Rc::new(MemoryStore::new());
    let refunds = refund_tool();
    let (agent, paused, decisions) = paused_refund(Some(store.clone()), refunds.clone());
    let resume_by_id = || block_on(agent.resume(&paused.run_id, &decisions, None, &mut CollectingSink::default()));
    assert_eq!(resume_by_id().unwrap().status, RunStatus::Completed);
    assert_eq!(resume_by_id().unwrap_err().code(), "invalid_resume", "the run completed: nothing to resume");
    // The state object handed out when the run paused: the store says the run moved on.
    let err = block_on(agent.resume_state(paused.state.clone().unwrap(), &decisions, None, &mut CollectingSink::default())).unwrap_err();
    assert!(matches!(&err, AgentError::InvalidResume(m) if m.contains("resumed to its end already")), "{err}");
    // Another agent on the same store (another tab, another process) is refused the same way.
    let other = refund_agent(ScriptedModel::repeating(text("x")), refunds.clone(), store);
    assert_eq!(
        block_on(other.resume_state(paused.state.clone().unwrap(), &decisions, None, &mut CollectingSink::default())).unwrap_err().code(),
        "invalid_resume"
    );
    assert_eq!(refunds.calls.get(), 1);
}

/// A refund that is stopped while it runs: it cancels the run, yields, then completes.
struct RefundStoppedMidway {
    flag: Rc<CancelFlag>,
    calls: std::cell::Cell<usize>,
}

#[async_trait::async_trait(?Send)]
impl crucible::tools::ToolHandler for RefundStoppedMidway {
    async fn call(&self, args: Value, _ctx: &crucible::tools::CallContext) -> Result<Value, crucible::tools::ToolFailure> {
        self.calls.set(self.calls.get() + 1);
        self.flag.cancel();
        YieldOnce::default().await;
        Ok(json!({ "refunded": args["order"] }))
    }

    async fn needs_approval(&self, _args: &Value) -> bool {
        true
    }
}

#[test]
fn a_resume_stopped_while_its_approved_call_runs_saves_the_call_so_it_never_runs_twice() {
    let store = Rc::new(MemoryStore::new());
    let flag = Rc::new(CancelFlag::default());
    let refund = Rc::new(RefundStoppedMidway { flag: flag.clone(), calls: Default::default() });
    let mut tools = ToolSet::new();
    tools.insert(Tool::new("refund", "Refund an order", &json!({ "type": "object" }), None, refund.clone()).unwrap());
    let model = ScriptedModel::new(vec![call("refund", r#"{"order":42}"#), text("Refunded order 42.")]);
    let agent = Agent::new(AgentConfig::default(), model.clone(), tools, Rc::new(NativeEnvironment::default())).unwrap().with_store(store, "support-bot");
    let paused = block_on(agent.run("Refund order 42", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    let decisions = [ApprovalDecision { id: paused.pending_approvals[0].id.clone(), approved: true, reason: None }];
    let err = block_on(agent.resume(&paused.run_id, &decisions, Some(flag.clone()), &mut CollectingSink::default())).unwrap_err();
    assert_eq!(err, AgentError::Aborted);
    assert_eq!(refund.calls.get(), 1);
    // The approved call finished and its step was saved: the run goes on after it.
    let out = block_on(agent.resume(&paused.run_id, &[], None, &mut CollectingSink::default())).unwrap();
    assert_eq!(out.text, "Refunded order 42.");
    assert_eq!(refund.calls.get(), 1, "the approved call ran once");
    assert!(matches!(model.requests.borrow().last().unwrap().messages.last().unwrap(), Message::Tool { content, .. } if content.contains("refunded")));
}

/// A lookup that needs no approval and ignores the run's signal: it cancels the run, then
/// takes a while before it ends.
struct LookupIgnoringTheAbort {
    flag: Rc<CancelFlag>,
    finished: std::cell::Cell<bool>,
}

#[async_trait::async_trait(?Send)]
impl crucible::tools::ToolHandler for LookupIgnoringTheAbort {
    async fn call(&self, _args: Value, _ctx: &crucible::tools::CallContext) -> Result<Value, crucible::tools::ToolFailure> {
        self.flag.cancel();
        for _ in 0..100 {
            YieldOnce::default().await;
        }
        self.finished.set(true);
        Ok(json!({ "found": true }))
    }
}

#[test]
fn a_resume_aborted_while_a_call_that_needed_no_approval_runs_ends_without_waiting_for_it() {
    let store = Rc::new(MemoryStore::new());
    let flag = Rc::new(CancelFlag::default());
    let lookup = Rc::new(LookupIgnoringTheAbort { flag: flag.clone(), finished: Default::default() });
    let model = ScriptedModel::new(vec![calls(&[("refund", r#"{"order":1,"amount":50}"#), ("lookup", "{}")]), text("Looked it up again.")]);
    let refunds = Rc::new(NeedsApproval { inner: refund_tool(), predicate: Box::new(|_: &Value| true) });
    let mut tools = ToolSet::new();
    tools.insert(Tool::new("refund", "Refund an order", &json!({ "type": "object" }), None, refunds).unwrap());
    tools.insert(Tool::new("lookup", "Look an order up", &json!({ "type": "object" }), None, lookup.clone()).unwrap());
    let agent = Agent::new(AgentConfig::default(), model.clone(), tools, Rc::new(NativeEnvironment::default())).unwrap().with_store(store, "support-bot");
    let paused = block_on(agent.run("refund order 1", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    let decisions = [ApprovalDecision { id: paused.pending_approvals[0].id.clone(), approved: false, reason: Some("no".into()) }];
    let err = block_on(agent.resume(&paused.run_id, &decisions, Some(flag.clone()), &mut CollectingSink::default())).unwrap_err();
    assert_eq!(err, AgentError::Aborted);
    // Before: the resume waited for the lookup to end, and a lookup that never ends held it
    // (and `close()`) for good. Only calls a human approved are run to their end.
    assert!(!lookup.finished.get(), "the lookup was abandoned, as any call is on an abort");
    // The step was saved with the lookup recorded as aborted: the model learns it did not finish.
    let out = block_on(agent.resume(&paused.run_id, &[], None, &mut CollectingSink::default())).unwrap();
    assert_eq!(out.text, "Looked it up again.");
    let last = model.requests.borrow().last().unwrap().messages.clone();
    assert!(last.iter().any(|m| matches!(m, Message::Tool { content, .. } if content.contains("aborted") && content.contains("did not finish"))), "{last:?}");
}

/// A resume whose signal was aborted before it began: nothing runs, and the same state
/// resumes afterwards. (One run per test: run ids repeat across agents of a test thread, and a
/// context remembers the states it resumed.)
fn resume_aborted_before_it_starts(store: Option<Rc<MemoryStore>>) {
    let refunds = refund_tool();
    let (agent, paused, decisions) = paused_refund(store, refunds.clone());
    let aborted = Rc::new(CancelFlag::default());
    aborted.cancel();
    let state = || paused.state.clone().unwrap();
    let err = block_on(agent.resume_state(state(), &decisions, Some(aborted), &mut CollectingSink::default())).unwrap_err();
    assert_eq!(err, AgentError::Aborted);
    assert_eq!(refunds.calls.get(), 0, "an approved call must not run for a resume aborted before it began");
    let out = block_on(agent.resume_state(state(), &decisions, None, &mut CollectingSink::default())).unwrap();
    assert_eq!((out.status, refunds.calls.get()), (RunStatus::Completed, 1));
}

#[test]
fn a_resume_aborted_before_it_starts_runs_nothing_and_leaves_the_run_resumable() {
    resume_aborted_before_it_starts(Some(Rc::new(MemoryStore::new())));
}

#[test]
fn without_a_store_too_a_resume_aborted_before_it_starts_runs_nothing() {
    resume_aborted_before_it_starts(None);
}

#[test]
fn two_resumes_at_once_run_the_approved_call_once() {
    let refunds = refund_tool();
    let (agent, paused, decisions) = paused_refund(Some(Rc::new(MemoryStore::new())), refunds.clone());
    let (mut a, mut b) = (CollectingSink::default(), CollectingSink::default());
    let (first, second) = block_on(futures::future::join(
        agent.resume(&paused.run_id, &decisions, None, &mut a),
        agent.resume_state(paused.state.clone().unwrap(), &decisions, None, &mut b),
    ));
    assert_eq!(first.unwrap().status, RunStatus::Completed);
    assert!(matches!(&second, Err(AgentError::InvalidResume(m)) if m.contains("already being resumed")), "{second:?}");
    assert_eq!(refunds.calls.get(), 1);
}

#[test]
fn without_a_store_a_state_object_still_resumes_only_once_in_this_context() {
    let refunds = refund_tool();
    let (agent, paused, decisions) = paused_refund(None, refunds.clone());
    let resume = || block_on(agent.resume_state(paused.state.clone().unwrap(), &decisions, None, &mut CollectingSink::default()));
    assert_eq!(resume().unwrap().status, RunStatus::Completed);
    assert!(matches!(resume(), Err(AgentError::InvalidResume(m)) if m.contains("already resumed from this state")));
    assert_eq!(refunds.calls.get(), 1);
}

#[test]
fn two_decisions_for_one_approval_are_refused() {
    let refunds = refund_tool();
    let (agent, paused, decisions) = paused_refund(Some(Rc::new(MemoryStore::new())), refunds.clone());
    let twice = vec![decisions[0].clone(), ApprovalDecision { approved: false, ..decisions[0].clone() }];
    let err = block_on(agent.resume(&paused.run_id, &twice, None, &mut CollectingSink::default())).unwrap_err();
    assert!(matches!(&err, AgentError::InvalidResume(m) if m.contains("two decisions")), "{err}");
    assert_eq!(refunds.calls.get(), 0);
    // A refused resume does not use the state up: the corrected one goes through.
    assert_eq!(block_on(agent.resume(&paused.run_id, &decisions, None, &mut CollectingSink::default())).unwrap().status, RunStatus::Completed);
    assert_eq!(refunds.calls.get(), 1);
}

#[test]
fn a_run_that_hit_a_limit_leaves_no_state_behind_but_one_that_failed_on_the_model_does() {
    let store = Rc::new(MemoryStore::new());
    let mut tools = ToolSet::new();
    tools.insert(Tool::new("ping", "Ping", &json!({ "type": "object" }), None, FnTool::new(|_| Ok(json!("pong")))).unwrap());
    let config = AgentConfig { max_turns: 2, ..AgentConfig::default() };
    let looping = ScriptedModel::repeating(call("ping", "{}"));
    let agent = Agent::new(config, looping, tools.clone(), Rc::new(NativeEnvironment::default())).unwrap().with_store(store.clone(), "bot");
    let err = block_on(agent.run("ping forever", RunOptions::default(), &mut CollectingSink::default())).unwrap_err();
    assert_eq!(err.code(), "max_turns_exceeded");
    assert!(block_on(store.scan("agent/bot/run/")).unwrap().is_empty(), "resuming it would only hit the limit again");

    // The model fails after one step: the run stays resumable from that step.
    let failing = ScriptedModel::new(vec![call("ping", "{}")]);
    let agent = Agent::new(AgentConfig::default(), failing, tools, Rc::new(NativeEnvironment::default())).unwrap().with_store(store.clone(), "bot");
    let err = block_on(agent.run("ping once", RunOptions::default(), &mut CollectingSink::default())).unwrap_err();
    assert_eq!(err.code(), "provider_protocol");
    assert_eq!(block_on(store.scan("agent/bot/run/")).unwrap().len(), 1);
}

/// A store that is full: every write fails with `store_quota` (a test double).
struct FullStore;

#[async_trait::async_trait(?Send)]
impl Store for FullStore {
    async fn get(&self, _key: &str) -> Result<Option<Value>, crucible::store::StoreError> {
        Ok(None)
    }
    async fn put(&self, _key: &str, _value: Value) -> Result<(), crucible::store::StoreError> {
        Err(crucible::store::StoreError::new("store_quota", "the disk is full"))
    }
    async fn delete(&self, _key: &str) -> Result<(), crucible::store::StoreError> {
        Ok(())
    }
    async fn scan(&self, _prefix: &str) -> Result<Vec<(String, Value)>, crucible::store::StoreError> {
        Ok(vec![])
    }
    async fn batch(&self, _ops: Vec<crucible::store::BatchOp>) -> Result<(), crucible::store::StoreError> {
        Err(crucible::store::StoreError::new("store_quota", "the disk is full"))
    }
}

#[test]
fn an_approval_is_announced_only_once_its_run_is_saved() {
    let refunds = refund_tool();
    let handler = Rc::new(NeedsApproval { inner: refunds.clone(), predicate: Box::new(|_: &Value| true) });
    let mut tools = ToolSet::new();
    tools.insert(Tool::new("refund", "Refund an order", &json!({ "type": "object" }), None, handler).unwrap());
    let model = ScriptedModel::new(vec![call("refund", r#"{"order":42,"amount":99}"#)]);
    let agent = Agent::new(AgentConfig::default(), model, tools, Rc::new(NativeEnvironment::default())).unwrap().with_store(Rc::new(FullStore), "bot");
    let mut sink = CollectingSink::default();
    let err = block_on(agent.run("Refund order 42", RunOptions::default(), &mut sink)).unwrap_err();
    assert_eq!(err.code(), "store_quota");
    // Nobody is asked to approve a call of a run that could never resume.
    assert!(!sink.events.iter().any(|e| matches!(e.body, EventBody::ApprovalRequested { .. })));
    assert!(matches!(sink.events.last().unwrap().body, EventBody::AgentError { .. }));
    assert_eq!(refunds.calls.get(), 0);
}

/// The store's records, copied: what another process opening the same store would read.
fn records_of(store: &MemoryStore) -> Vec<(String, Value)> {
    block_on(store.scan("")).unwrap()
}

fn store_with(records: Vec<(String, Value)>) -> Rc<MemoryStore> {
    let store = Rc::new(MemoryStore::new());
    for (key, value) in records {
        block_on(store.put(&key, value)).unwrap();
    }
    store
}

#[test]
fn a_paused_state_kept_past_a_restart_cannot_run_its_approved_call_again() {
    // Process 1 pauses; process 2 resumes, and the run is stopped right after the approved
    // refund ran (its step saved, the run interrupted at the same counters); process 3 still
    // holds the paused state. Each "process" is a thread: nothing in memory is shared.
    let flag = Rc::new(CancelFlag::default());
    let refund = Rc::new(RefundStoppedMidway { flag: flag.clone(), calls: Default::default() });
    let mut tools = ToolSet::new();
    tools.insert(Tool::new("refund", "Refund an order", &json!({ "type": "object" }), None, refund.clone()).unwrap());
    let store = Rc::new(MemoryStore::new());
    let model = ScriptedModel::new(vec![call("refund", r#"{"order":42}"#)]);
    let agent = Agent::new(AgentConfig::default(), model, tools, Rc::new(NativeEnvironment::default())).unwrap().with_store(store.clone(), "support-bot");
    let paused = block_on(agent.run("Refund order 42", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    let kept = paused.state.clone().unwrap();
    let decisions = vec![ApprovalDecision { id: paused.pending_approvals[0].id.clone(), approved: true, reason: None }];
    assert_eq!(block_on(agent.resume(&paused.run_id, &decisions, Some(flag), &mut CollectingSink::default())).unwrap_err(), AgentError::Aborted);
    assert_eq!(refund.calls.get(), 1);

    let records = records_of(&store);
    let (calls, err) = std::thread::spawn(move || {
        let refunds = refund_tool();
        let agent = refund_agent(ScriptedModel::repeating(text("Refunded.")), refunds.clone(), store_with(records));
        let err = block_on(agent.resume_state(kept, &decisions, None, &mut CollectingSink::default())).err();
        (refunds.calls.get(), err)
    })
    .join()
    .unwrap();
    assert!(matches!(&err, Some(AgentError::InvalidResume(m)) if m.contains("later state")), "{err:?}");
    assert_eq!(calls, 0, "the refund ran once, in process 2");
}

#[test]
fn with_a_store_the_stored_calls_run_not_calls_edited_into_the_state() {
    let store = Rc::new(MemoryStore::new());
    let refunded = Rc::new(std::cell::RefCell::new(Vec::new()));
    let log = refunded.clone();
    let refunds = FnTool::new(move |args| {
        log.borrow_mut().push(args["order"].clone());
        Ok(json!({ "refunded": args["order"] }))
    });
    let model = ScriptedModel::new(vec![call("refund", r#"{"order":42,"amount":99}"#), text("Refunded.")]);
    let agent = refund_agent(model, refunds, store);
    let paused = block_on(agent.run("Refund order 42", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    let mut edited = paused.state.clone().unwrap();
    let pending = edited.pending.as_mut().unwrap();
    pending.calls[0].arguments = r#"{"order":9999,"amount":50000}"#.into();
    let decisions = [ApprovalDecision { id: paused.pending_approvals[0].id.clone(), approved: true, reason: None }];
    let out = block_on(agent.resume_state(edited, &decisions, None, &mut CollectingSink::default())).unwrap();
    assert_eq!(out.status, RunStatus::Completed);
    assert_eq!(*refunded.borrow(), vec![json!(42)], "the call a human approved, as stored");
}

#[test]
fn runs_of_one_session_that_overlap_both_stay_in_its_conversation() {
    let store = Rc::new(MemoryStore::new());
    let model = ScriptedModel::new(vec![call("refund", r#"{"order":42,"amount":99}"#), text("B answer"), text("Refunded.")]);
    let agent = refund_agent(model, refund_tool(), store);
    let paused = block_on(agent.run("Refund order 42", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    assert_eq!(paused.status, RunStatus::Paused);
    // While A waits for its approval, B runs to its end in the same session.
    block_on(agent.run("question B", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    let decisions = [ApprovalDecision { id: paused.pending_approvals[0].id.clone(), approved: true, reason: None }];
    block_on(agent.resume(&paused.run_id, &decisions, None, &mut CollectingSink::default())).unwrap();
    let said: Vec<String> = agent
        .history("default")
        .iter()
        .filter_map(|m| match m {
            Message::User { content } => Some(format!("user:{content}")),
            Message::Assistant { content, .. } if !content.is_empty() => Some(format!("assistant:{content}")),
            _ => None,
        })
        .collect();
    assert_eq!(said, ["user:question B", "assistant:B answer", "user:Refund order 42", "assistant:Refunded."]);
}

#[test]
fn a_run_that_fails_in_its_first_turn_is_stored_and_resumes() {
    let store = Rc::new(MemoryStore::new());
    let down = ScriptedModel::new(vec![]);
    let agent = refund_agent(down, refund_tool(), store.clone());
    let err = block_on(agent.run("Refund order 42", RunOptions::default(), &mut CollectingSink::default())).unwrap_err();
    assert_eq!(err.code(), "provider_protocol");
    let stored = block_on(agent.stored_runs()).unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].status, StoredRunStatus::Interrupted);
    // The model is back (a new agent over the same store): the run asks it again.
    let back = ScriptedModel::new(vec![text("Done.")]);
    let agent = refund_agent(back.clone(), refund_tool(), store.clone());
    let out = block_on(agent.resume(&stored[0].run_id, &[], None, &mut CollectingSink::default())).unwrap();
    assert_eq!(out.text, "Done.");
    assert!(matches!(back.requests.borrow()[0].messages.last(), Some(Message::User { content }) if content == "Refund order 42"));
    assert!(block_on(agent.stored_runs()).unwrap().is_empty(), "completed: nothing left to resume");
}

/// A store whose locks other contexts (tabs) hold: `held` names the ones held now. A test
/// double over a `MemoryStore`.
#[derive(Default)]
struct SharedLockStore {
    inner: MemoryStore,
    held: std::cell::RefCell<std::collections::HashSet<String>>,
}

#[async_trait::async_trait(?Send)]
impl Store for SharedLockStore {
    async fn get(&self, key: &str) -> Result<Option<Value>, crucible::store::StoreError> {
        self.inner.get(key).await
    }
    async fn put(&self, key: &str, value: Value) -> Result<(), crucible::store::StoreError> {
        self.inner.put(key, value).await
    }
    async fn delete(&self, key: &str) -> Result<(), crucible::store::StoreError> {
        self.inner.delete(key).await
    }
    async fn scan(&self, prefix: &str) -> Result<Vec<(String, Value)>, crucible::store::StoreError> {
        self.inner.scan(prefix).await
    }
    async fn batch(&self, ops: Vec<crucible::store::BatchOp>) -> Result<(), crucible::store::StoreError> {
        self.inner.batch(ops).await
    }
    async fn lock_held(&self, name: &str) -> Result<bool, crucible::store::StoreError> {
        Ok(self.held.borrow().contains(name))
    }
}

#[test]
fn a_run_another_context_is_driving_is_listed_running_and_its_saved_status_once_it_lets_go() {
    let store = Rc::new(SharedLockStore::default());
    let agent = refund_agent_without_store(AgentConfig::default(), ScriptedModel::new(vec![]), refund_tool()).with_store(store.clone(), "support-bot");
    let err = block_on(agent.run("Refund order 42", RunOptions::default(), &mut CollectingSink::default())).unwrap_err();
    assert_eq!(err.code(), "provider_protocol");
    let run_id = block_on(agent.stored_runs()).unwrap()[0].run_id.clone();
    // Another tab resumes it: it holds the run's lock while it drives the run.
    store.held.borrow_mut().insert(format!("run:support-bot/{run_id}"));
    assert_eq!(block_on(agent.stored_runs()).unwrap()[0].status, StoredRunStatus::Running);
    store.held.borrow_mut().clear();
    assert_eq!(block_on(agent.stored_runs()).unwrap()[0].status, StoredRunStatus::Interrupted);
}

#[test]
fn an_aborted_run_is_aborted_whatever_error_the_model_fails_with() {
    let flag = Rc::new(CancelFlag::default());
    let agent = Agent::new(
        AgentConfig::default(),
        Rc::new(AbortedMidAnswer {
            flag: flag.clone(),
            then: AfterAbort::Fail(ModelError::new("provider_protocol", "The operation was aborted due to timeout")),
        }),
        ToolSet::new(),
        Rc::new(NativeEnvironment::default()),
    )
    .unwrap();
    let options = RunOptions { cancel: Some(flag), ..RunOptions::default() };
    assert_eq!(block_on(agent.run("hi", options, &mut CollectingSink::default())).unwrap_err(), AgentError::Aborted);
}

#[test]
fn the_paused_steps_end_reports_the_tokens_of_its_turn() {
    let (agent, paused, decisions) = paused_refund(Some(Rc::new(MemoryStore::new())), refund_tool());
    let mut sink = CollectingSink::default();
    block_on(agent.resume(&paused.run_id, &decisions, None, &mut sink)).unwrap();
    let first_end = sink.events.iter().find_map(|e| match &e.body {
        EventBody::StepEnd { step: 0, usage, .. } => Some(*usage),
        _ => None,
    });
    assert_eq!(first_end, Some(crucible::model::Usage { input_tokens: 10, output_tokens: 5 }));
}

#[test]
fn a_run_that_ends_after_its_session_ended_does_not_bring_the_conversation_back() {
    let model = ScriptedModel::new(vec![text("first answer"), text("a long answer that streams in many pieces")]);
    let agent = Agent::new(AgentConfig::default(), model, ToolSet::new(), Rc::new(NativeEnvironment::default())).unwrap();
    block_on(agent.run("first", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    let end_meanwhile = async {
        YieldOnce::default().await; // the second run is streaming its answer
        agent.end_session("default");
    };
    let mut sink = CollectingSink::default();
    let (out, ()) = block_on(futures::future::join(agent.run("second", RunOptions::default(), &mut sink), end_meanwhile));
    assert_eq!(out.unwrap().status, RunStatus::Completed, "the run itself finishes");
    assert!(agent.history("default").is_empty(), "{:?}", agent.history("default"));
}

/// A session with one completed run, then a run of it paused on a refund, resumed with the
/// refund approved; `meanwhile` runs while it is paused. Returns the session's history.
fn pause_and_resume_in_a_session(meanwhile: impl FnOnce(&Agent)) -> Vec<Message> {
    let model = ScriptedModel::new(vec![text("my secret is 1234"), call("refund", r#"{"order":42,"amount":99}"#), text("Refunded.")]);
    let agent = refund_agent(model, refund_tool(), Rc::new(MemoryStore::new()));
    block_on(agent.run("remember this", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    let paused = block_on(agent.run("Refund order 42", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    assert_eq!(paused.status, RunStatus::Paused);
    meanwhile(&agent);
    let decisions = [ApprovalDecision { id: paused.pending_approvals[0].id.clone(), approved: true, reason: None }];
    let out = block_on(agent.resume(&paused.run_id, &decisions, None, &mut CollectingSink::default())).unwrap();
    assert_eq!(out.status, RunStatus::Completed, "the run itself finishes");
    agent.history("default")
}

#[test]
fn a_run_paused_when_its_session_ended_does_not_bring_the_conversation_back_when_resumed() {
    let history = pause_and_resume_in_a_session(|agent| agent.end_session("default"));
    assert!(history.is_empty(), "the ended session stays ended: {history:?}");
}

#[test]
fn a_run_paused_and_resumed_in_a_live_session_adds_its_messages() {
    let history = pause_and_resume_in_a_session(|_| {});
    assert_eq!(history.len(), 6, "{history:?}");
    assert!(matches!(history.last(), Some(Message::Assistant { content, .. }) if content == "Refunded."));
}

#[test]
fn a_run_whose_resume_failed_after_its_session_ended_does_not_bring_the_conversation_back_later() {
    let model = ScriptedModel::new(vec![
        text("my secret is 1234"),
        call("refund", r#"{"order":42,"amount":99}"#),
        Reply::Fail(ModelError::new("provider_http", "the model is down")),
        text("Refunded."),
    ]);
    let agent = refund_agent(model, refund_tool(), Rc::new(MemoryStore::new()));
    block_on(agent.run("remember this", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    let paused = block_on(agent.run("Refund order 42", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    agent.end_session("default");
    let decisions = [ApprovalDecision { id: paused.pending_approvals[0].id.clone(), approved: true, reason: None }];
    let failed = block_on(agent.resume(&paused.run_id, &decisions, None, &mut CollectingSink::default()));
    assert_eq!(failed.unwrap_err().code(), "provider_http", "the resume fails on the model and stays resumable");
    let out = block_on(agent.resume(&paused.run_id, &[], None, &mut CollectingSink::default())).unwrap();
    assert_eq!(out.status, RunStatus::Completed);
    assert!(agent.history("default").is_empty(), "the ended session stays ended: {:?}", agent.history("default"));
}

/// A store whose reads, or whose lock, stop answering when told to (a network store whose
/// connection died, a run lock another tab holds): a test double over a `MemoryStore`.
#[derive(Default)]
struct StallingStore {
    inner: MemoryStore,
    stalled: std::cell::Cell<&'static str>,
    /// With `stalled` at "put", writes wait for this (a store that answers late, not never).
    puts_released: CancelFlag,
}

#[async_trait::async_trait(?Send)]
impl Store for StallingStore {
    async fn get(&self, key: &str) -> Result<Option<Value>, crucible::store::StoreError> {
        if self.stalled.get() == "get" {
            futures::future::pending::<()>().await;
        }
        self.inner.get(key).await
    }
    async fn put(&self, key: &str, value: Value) -> Result<(), crucible::store::StoreError> {
        if self.stalled.get() == "put" {
            self.puts_released.cancelled().await;
        }
        self.inner.put(key, value).await
    }
    async fn delete(&self, key: &str) -> Result<(), crucible::store::StoreError> {
        self.inner.delete(key).await
    }
    async fn scan(&self, prefix: &str) -> Result<Vec<(String, Value)>, crucible::store::StoreError> {
        self.inner.scan(prefix).await
    }
    async fn batch(&self, ops: Vec<crucible::store::BatchOp>) -> Result<(), crucible::store::StoreError> {
        self.inner.batch(ops).await
    }
    async fn lock(&self, _name: &str) -> Result<Option<crucible::store::StoreLock>, crucible::store::StoreError> {
        if self.stalled.get() == "lock" {
            futures::future::pending::<()>().await;
        }
        Ok(None)
    }
}

/// An aborted resume gives up waiting for the store (`stalled`: its read or its lock), so
/// neither it nor `close()`, which waits for it, hangs; once the store answers, the run resumes.
fn an_aborted_resume_stops_waiting_for_the_store(stalled: &'static str, from_state: bool) {
    use futures::FutureExt;
    let store = Rc::new(StallingStore::default());
    let refunds = refund_tool();
    let handler = Rc::new(NeedsApproval { inner: refunds.clone(), predicate: Box::new(|_: &Value| true) });
    let mut tools = ToolSet::new();
    tools.insert(Tool::new("refund", "Refund an order", &json!({ "type": "object" }), None, handler).unwrap());
    let model = ScriptedModel::new(vec![call("refund", r#"{"order":42}"#), text("Refunded.")]);
    let agent = Agent::new(AgentConfig::default(), model, tools, Rc::new(NativeEnvironment::default())).unwrap().with_store(store.clone(), "bot");
    let paused = block_on(agent.run("Refund order 42", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    let decisions = [ApprovalDecision { id: paused.pending_approvals[0].id.clone(), approved: true, reason: None }];
    store.stalled.set(stalled);
    let aborted = Rc::new(CancelFlag::default());
    aborted.cancel();
    let mut sink = CollectingSink::default();
    let resumed = if from_state {
        agent.resume_state(paused.state.clone().unwrap(), &decisions, Some(aborted), &mut sink).now_or_never()
    } else {
        agent.resume(&paused.run_id, &decisions, Some(aborted), &mut sink).now_or_never()
    };
    assert!(matches!(resumed, Some(Err(AgentError::Aborted))), "the resume waited for a store that does not answer: {resumed:?}");
    assert_eq!(refunds.calls.get(), 0);
    store.stalled.set("");
    let out = block_on(agent.resume(&paused.run_id, &decisions, None, &mut CollectingSink::default())).unwrap();
    assert_eq!((out.status, out.text.as_str(), refunds.calls.get()), (RunStatus::Completed, "Refunded.", 1));
}

/// A run aborted while the store writes its state ends at once, but the write lands later. A
/// `discard_run` right after the abort does not wait for it (one write that never settles
/// would hold every discard), yet what the write brings is deleted once it lands: by the
/// background task where the host can spawn one (`spawning`), else by the resume that waits
/// for the write, which then finds no run. A resume of a run not discarded waits for the write
/// and resumes from the step it saved.
fn a_state_written_after_its_run_was_aborted(spawning: bool, discard: bool) {
    use futures::FutureExt;
    let store = Rc::new(StallingStore::default());
    let aborted = Rc::new(CancelFlag::default());
    // The run's tool stops it, with the step's save to come, which the store answers late.
    let (stopper, stalling) = (aborted.clone(), store.clone());
    let stop = FnTool::new(move |_| {
        stalling.stalled.set("put");
        stopper.cancel();
        Ok(json!("stopped"))
    });
    let mut tools = ToolSet::new();
    tools.insert(Tool::new("stop", "Stops", &json!({ "type": "object" }), None, stop).unwrap());
    let model = ScriptedModel::new(vec![call("stop", "{}"), text("Resumed.")]);
    let background = Rc::new(support::emergent::SpawningEnvironment::default());
    let env: Rc<dyn crucible::agent::Environment> = if spawning { background.clone() } else { Rc::new(NativeEnvironment::default()) };
    let agent = Agent::new(AgentConfig::default(), model, tools, env).unwrap().with_store(store.clone(), "bot");
    let options = RunOptions { cancel: Some(aborted.clone()), run_id: Some("r1".into()), ..Default::default() };
    let run = agent.run("go", options, &mut CollectingSink::default()).now_or_never();
    assert!(matches!(run, Some(Err(AgentError::Aborted))), "the abort ends the run at once: {run:?}");
    let key = "agent/bot/run/r1";
    let turns = |store: &StallingStore| block_on(store.inner.get(key)).unwrap().map(|v| v["data"]["turns"].clone());
    assert_eq!(turns(&store), Some(json!(0)), "its step's state is not written yet, only the one it started from");
    if discard {
        let discarded = agent.discard_run("r1").now_or_never();
        assert!(matches!(discarded, Some(Ok(true))), "discard_run does not wait for the write: {discarded:?}");
        assert!(block_on(agent.stored_runs()).unwrap().is_empty());
    }
    store.puts_released.cancel();
    background.run_background();
    let resumed = block_on(agent.resume("r1", &[], None, &mut CollectingSink::default()));
    if discard {
        assert!(matches!(resumed, Err(AgentError::InvalidResume(_))), "{resumed:?}");
        assert_eq!(turns(&store), None, "nothing came back");
    } else {
        let resumed = resumed.unwrap();
        assert_eq!((resumed.status, resumed.turns), (RunStatus::Completed, 2), "resumed from the step the late write saved");
    }
}

#[test]
fn a_run_discarded_while_its_last_save_is_out_stays_discarded_once_the_save_lands() {
    a_state_written_after_its_run_was_aborted(true, true);
    a_state_written_after_its_run_was_aborted(false, true);
}

#[test]
fn a_resume_waits_for_the_save_its_aborted_run_left_out() {
    a_state_written_after_its_run_was_aborted(true, false);
    a_state_written_after_its_run_was_aborted(false, false);
}

#[test]
fn an_aborted_resume_stops_waiting_for_a_store_read_that_never_answers() {
    an_aborted_resume_stops_waiting_for_the_store("get", false);
}

#[test]
fn an_aborted_resume_stops_waiting_for_the_run_lock() {
    an_aborted_resume_stops_waiting_for_the_store("lock", false);
}

#[test]
fn an_aborted_resume_from_a_state_stops_waiting_for_a_store_read_that_never_answers() {
    an_aborted_resume_stops_waiting_for_the_store("get", true);
}

/// A charge that, while it runs, has another agent on the same store (a second tab's) try to
/// resume its run, and keeps what that agent got.
struct ChargeWhileAnotherAgentResumes {
    other: std::cell::RefCell<Option<Agent>>,
    resumed: std::cell::RefCell<Option<Result<RunStatus, AgentError>>>,
    calls: std::cell::Cell<usize>,
}

#[async_trait::async_trait(?Send)]
impl crucible::tools::ToolHandler for ChargeWhileAnotherAgentResumes {
    async fn call(&self, _args: Value, ctx: &crucible::tools::CallContext) -> Result<Value, crucible::tools::ToolFailure> {
        use futures::FutureExt;
        self.calls.set(self.calls.get() + 1);
        if let Some(other) = self.other.borrow().as_ref() {
            let listed = other.stored_runs().now_or_never().unwrap().unwrap();
            assert_eq!(listed.len(), 1, "the step before the call is saved");
            assert_eq!(listed[0].status, crucible::agent::StoredRunStatus::Running, "the run is going in this context");
            let attempt = other.resume(&ctx.run_id, &[], None, &mut CollectingSink::default()).now_or_never();
            *self.resumed.borrow_mut() = attempt.map(|r| r.map(|out| out.status));
        }
        Ok(json!({ "charged": true }))
    }
}

#[test]
fn a_run_that_is_still_going_cannot_be_resumed_by_another_agent_on_its_store() {
    let store = Rc::new(MemoryStore::new());
    let charge = Rc::new(ChargeWhileAnotherAgentResumes { other: Default::default(), resumed: Default::default(), calls: Default::default() });
    let agent_with = |model: Rc<ScriptedModel>| {
        let mut tools = ToolSet::new();
        tools.insert(Tool::new("charge", "Charge a card", &json!({ "type": "object" }), None, charge.clone()).unwrap());
        Agent::new(AgentConfig::default(), model, tools, Rc::new(NativeEnvironment::default())).unwrap().with_store(store.clone(), "shop")
    };
    let first = agent_with(ScriptedModel::new(vec![call("charge", "{}"), text("Charged.")]));
    *charge.other.borrow_mut() = Some(agent_with(ScriptedModel::new(vec![call("charge", "{}"), text("Charged again.")])));
    let out = block_on(first.run("Charge alice", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    assert_eq!(out.text, "Charged.");
    let resumed = charge.resumed.borrow_mut().take();
    assert!(matches!(resumed, Some(Err(AgentError::InvalidResume(_)))), "refused at once while the run goes: {resumed:?}");
    assert_eq!(charge.calls.get(), 1, "the card is charged once");
}

#[test]
fn a_resumed_run_adds_its_own_messages_to_the_bounded_session_and_brings_back_none_it_dropped() {
    let store = Rc::new(MemoryStore::new());
    let refunds = refund_tool();
    let script = vec![text("a"), call("refund", r#"{"order":42,"amount":99}"#), text("b"), text("c"), text("d"), text("Refunded.")];
    let config = AgentConfig { session_history: HistoryLimits { max_messages: Some(6), ..HistoryLimits::default() }, ..AgentConfig::default() };
    let agent = refund_agent_with(config, ScriptedModel::new(script), refunds.clone(), store);
    let in_s = || RunOptions { session_id: Some("s".into()), ..Default::default() };
    let run = |input: &str| block_on(agent.run(input, in_s(), &mut CollectingSink::default())).unwrap();
    run("A");
    let paused = run("refund 42");
    assert_eq!(paused.status, RunStatus::Paused);
    for input in ["B", "C", "D"] {
        run(input);
    }
    let users =
        |history: Vec<Message>| history.into_iter().filter_map(|m| if let Message::User { content } = m { Some(content) } else { None }).collect::<Vec<_>>();
    assert_eq!(users(agent.history("s")), ["B", "C", "D"], "A was dropped to keep 6 messages");
    let decisions = vec![ApprovalDecision { id: paused.pending_approvals[0].id.clone(), approved: true, reason: None }];
    let done = block_on(agent.resume(&paused.run_id, &decisions, None, &mut CollectingSink::default())).unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(refunds.calls.get(), 1);
    // The refund's 4 messages follow what the session kept; A, which the paused run started
    // from, does not come back, and the oldest exchanges make room.
    let history = agent.history("s");
    assert_eq!(users(history.clone()), ["D", "refund 42"]);
    assert_eq!(history.len(), 6);
}

#[test]
fn a_state_handed_back_with_any_history_offset_resumes_without_overflow() {
    // resume_state takes the state from the caller: its historyOffset may be anything a u64
    // holds, and trimming after it must not overflow (a panic in a build with overflow checks,
    // a wrapped offset in one without).
    let refunds = refund_tool();
    let script = vec![text("a"), call("refund", r#"{"order":42,"amount":99}"#), text("Refunded.")];
    let config = AgentConfig { session_history: HistoryLimits { max_messages: Some(4), ..HistoryLimits::default() }, ..AgentConfig::default() };
    let agent = refund_agent_without_store(config, ScriptedModel::new(script), refunds.clone());
    let in_s = || RunOptions { session_id: Some("s".into()), ..Default::default() };
    block_on(agent.run("A", in_s(), &mut CollectingSink::default())).unwrap();
    let paused = block_on(agent.run("refund 42", in_s(), &mut CollectingSink::default())).unwrap();
    let mut state = paused.state.clone().unwrap();
    assert_eq!((state.history_len, state.history_offset), (Some(2), Some(0)));
    state.history_offset = Some(u64::MAX);
    let decisions = vec![ApprovalDecision { id: paused.pending_approvals[0].id.clone(), approved: true, reason: None }];
    let done = block_on(agent.resume_state(state, &decisions, None, &mut CollectingSink::default())).unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    // A's exchange is dropped to keep 4 messages: the refund's exchange stays whole.
    let history = agent.history("s");
    assert_eq!(history.len(), 4);
    assert_eq!(history[0], Message::User { content: "refund 42".into() });
}

#[test]
fn a_state_saved_before_history_len_was_recorded_keeps_its_exchanges_apart_for_later_trims() {
    let refunds = refund_tool();
    let script = vec![text("a"), call("refund", r#"{"order":42,"amount":99}"#), text("Refunded."), text("b")];
    let config = AgentConfig { session_history: HistoryLimits { max_messages: Some(6), ..HistoryLimits::default() }, ..AgentConfig::default() };
    let agent = refund_agent_without_store(config, ScriptedModel::new(script), refunds.clone());
    let in_s = || RunOptions { session_id: Some("s".into()), ..Default::default() };
    block_on(agent.run("A", in_s(), &mut CollectingSink::default())).unwrap();
    let paused = block_on(agent.run("refund 42", in_s(), &mut CollectingSink::default())).unwrap();
    let mut state = paused.state.clone().unwrap();
    // As an earlier build saved it: which of its messages were the session's is not known.
    (state.history_len, state.history_offset) = (None, None);
    let decisions = vec![ApprovalDecision { id: paused.pending_approvals[0].id.clone(), approved: true, reason: None }];
    block_on(agent.resume_state(state, &decisions, None, &mut CollectingSink::default())).unwrap();
    assert_eq!(agent.history("s").len(), 6, "A's exchange and the refund's");
    block_on(agent.run("B", in_s(), &mut CollectingSink::default())).unwrap();
    // 8 messages: dropping A's exchange is enough; the refund's stays.
    let history = agent.history("s");
    assert_eq!(history.len(), 6, "{history:?}");
    assert_eq!(history[0], Message::User { content: "refund 42".into() });
}

/// The user messages of `history`, in order.
fn user_inputs(history: &[Message]) -> Vec<String> {
    history.iter().filter_map(|m| if let Message::User { content } = m { Some(content.clone()) } else { None }).collect()
}

#[test]
fn runs_paused_before_a_restart_and_resumed_after_it_keep_what_the_new_process_added_to_their_session() {
    let store = Rc::new(MemoryStore::new());
    let approve = |paused: &crucible::agent::RunOutput| vec![ApprovalDecision { id: paused.pending_approvals[0].id.clone(), approved: true, reason: None }];
    let before =
        ScriptedModel::new(vec![text("my secret is 1234"), call("refund", r#"{"order":42,"amount":99}"#), call("refund", r#"{"order":43,"amount":99}"#)]);
    let agent = refund_agent(before, refund_tool(), store.clone());
    block_on(agent.run("remember this", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    let paused = ["Refund order 42", "Refund order 43"].map(|input| block_on(agent.run(input, RunOptions::default(), &mut CollectingSink::default())).unwrap());
    assert!(paused.iter().all(|p| p.status == RunStatus::Paused));
    drop(agent);

    // The restart: a new agent over the same store, whose session starts afresh.
    let after = ScriptedModel::new(vec![text("hello"), text("Refunded 42."), text("Refunded 43."), text("done")]);
    let agent = refund_agent(after.clone(), refund_tool(), store);
    block_on(agent.run("hi", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    for p in &paused {
        let out = block_on(agent.resume(&p.run_id, &approve(p), None, &mut CollectingSink::default())).unwrap();
        assert_eq!(out.status, RunStatus::Completed);
    }
    // The new process's exchange stays; each resumed run brings the conversation it started
    // from once (both started from "remember this"), then its own exchange.
    let history = agent.history("default");
    assert_eq!(user_inputs(&history), ["hi", "remember this", "Refund order 42", "Refund order 43"], "{history:?}");
    assert_eq!(history.len(), 2 + 2 + 4 + 4);

    block_on(agent.run("what now", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    let seen = after.requests.borrow().last().unwrap().messages.clone();
    assert_eq!(user_inputs(&seen), ["hi", "remember this", "Refund order 42", "Refund order 43", "what now"], "the next run sees it all, in order");
}

#[test]
fn a_run_resumed_by_a_second_agent_on_the_store_and_back_does_not_repeat_the_conversation_both_hold() {
    // Two tabs on one store: each resumes the other's paused run. Their sessions share the
    // conversation before the first pause, which must not come back twice.
    let store = Rc::new(MemoryStore::new());
    let approve = |paused: &crucible::agent::RunOutput| vec![ApprovalDecision { id: paused.pending_approvals[0].id.clone(), approved: true, reason: None }];
    let run = |id: &str| RunOptions { run_id: Some(id.into()), ..RunOptions::default() };
    let first = refund_agent(
        ScriptedModel::new(vec![text("hello"), call("refund", r#"{"order":42,"amount":99}"#), text("Refunded 43.")]),
        refund_tool(),
        store.clone(),
    );
    let second = refund_agent(ScriptedModel::new(vec![text("Refunded 42."), call("refund", r#"{"order":43,"amount":99}"#)]), refund_tool(), store);
    block_on(first.run("hi", run("r1"), &mut CollectingSink::default())).unwrap();
    let p42 = block_on(first.run("Refund order 42", run("r42"), &mut CollectingSink::default())).unwrap();
    assert_eq!(block_on(second.resume(&p42.run_id, &approve(&p42), None, &mut CollectingSink::default())).unwrap().status, RunStatus::Completed);
    assert_eq!(user_inputs(&second.history("default")), ["hi", "Refund order 42"]);
    let p43 = block_on(second.run("Refund order 43", run("r43"), &mut CollectingSink::default())).unwrap();
    assert_eq!(block_on(first.resume(&p43.run_id, &approve(&p43), None, &mut CollectingSink::default())).unwrap().status, RunStatus::Completed);

    let history = first.history("default");
    assert_eq!(user_inputs(&history), ["hi", "Refund order 42", "Refund order 43"], "{history:?}");
    assert_eq!(history.len(), 2 + 4 + 4);
}

#[test]
fn states_of_two_earlier_builds_processes_resumed_after_an_upgrade_each_bring_their_conversation() {
    // States saved before history epochs were recorded say nothing of which process counted
    // their positions: two processes' runs, each from position 0, are not one conversation.
    let approve = |paused: &crucible::agent::RunOutput| vec![ApprovalDecision { id: paused.pending_approvals[0].id.clone(), approved: true, reason: None }];
    let old_state = |first: &str, reply: &str, order: u32| {
        let agent = refund_agent_without_store(
            AgentConfig::default(),
            ScriptedModel::new(vec![text(reply), call("refund", &format!(r#"{{"order":{order},"amount":99}}"#))]),
            refund_tool(),
        );
        block_on(agent.run(first, RunOptions::default(), &mut CollectingSink::default())).unwrap();
        let run = RunOptions { run_id: Some(format!("refund-{order}")), ..RunOptions::default() };
        let paused = block_on(agent.run(&format!("Refund order {order}"), run, &mut CollectingSink::default())).unwrap();
        let mut state = paused.state.clone().unwrap();
        state.history_epoch = None;
        (state, approve(&paused))
    };
    let states = [old_state("from the first process", "one", 42), old_state("from the second process", "two", 43)];
    let agent = refund_agent_without_store(AgentConfig::default(), ScriptedModel::new(vec![text("Refunded 42."), text("Refunded 43.")]), refund_tool());
    for (state, decisions) in states {
        assert_eq!(block_on(agent.resume_state(state, &decisions, None, &mut CollectingSink::default())).unwrap().status, RunStatus::Completed);
    }
    let history = agent.history("default");
    assert_eq!(user_inputs(&history), ["from the first process", "Refund order 42", "from the second process", "Refund order 43"], "{history:?}");
}

#[test]
fn states_of_one_earlier_builds_process_resumed_after_an_upgrade_bring_their_shared_conversation_once() {
    let approve = |paused: &crucible::agent::RunOutput| vec![ApprovalDecision { id: paused.pending_approvals[0].id.clone(), approved: true, reason: None }];
    let old = refund_agent_without_store(
        AgentConfig::default(),
        ScriptedModel::new(vec![text("hello"), call("refund", r#"{"order":42,"amount":99}"#), call("refund", r#"{"order":43,"amount":99}"#)]),
        refund_tool(),
    );
    block_on(old.run("hi", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    let paused = ["Refund order 42", "Refund order 43"].map(|input| block_on(old.run(input, RunOptions::default(), &mut CollectingSink::default())).unwrap());
    let agent = refund_agent_without_store(AgentConfig::default(), ScriptedModel::new(vec![text("Refunded 42."), text("Refunded 43.")]), refund_tool());
    for p in &paused {
        let mut state = p.state.clone().unwrap();
        state.history_epoch = None;
        assert_eq!(block_on(agent.resume_state(state, &approve(p), None, &mut CollectingSink::default())).unwrap().status, RunStatus::Completed);
    }
    let history = agent.history("default");
    assert_eq!(user_inputs(&history), ["hi", "Refund order 42", "Refund order 43"], "{history:?}");
}

#[test]
fn a_providers_value_for_a_call_is_stored_with_the_run_and_handed_back_after_a_restart() {
    // What DeepSeek (the turn's reasoning) and Gemini (a thought signature) need back with the
    // call: the provider object that received it is gone when another process resumes.
    let echo = json!({ "reasoning_content": "The order is large: ask first.", "extra_content": { "google": { "thought_signature": "CrIC" } } });
    let store = Rc::new(MemoryStore::new());
    let first = refund_agent(ScriptedModel::new(vec![call_with_data("refund", r#"{"order":42,"amount":99}"#, echo.clone())]), refund_tool(), store.clone());
    let paused = block_on(first.run("Refund order 42", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    assert_eq!(paused.status, RunStatus::Paused);
    let records = records_of(&store);
    drop(first);

    let decisions = vec![ApprovalDecision { id: paused.pending_approvals[0].id.clone(), approved: true, reason: None }];
    let seen = std::thread::spawn(move || {
        let model = ScriptedModel::new(vec![text("Refunded order 42.")]);
        let agent = refund_agent(model.clone(), refund_tool(), store_with(records));
        let out = block_on(agent.resume(&paused.run_id, &decisions, None, &mut CollectingSink::default())).unwrap();
        assert_eq!(out.status, RunStatus::Completed);
        let request = model.requests.borrow()[0].clone();
        request.messages.into_iter().find_map(|m| match m {
            Message::Assistant { tool_calls, .. } if !tool_calls.is_empty() => Some(tool_calls[0].provider_data.clone()),
            _ => None,
        })
    })
    .join()
    .unwrap();
    assert_eq!(seen, Some(Some(echo)));
}

#[test]
fn a_run_stored_before_calls_carried_a_providers_value_still_resumes() {
    let store = Rc::new(MemoryStore::new());
    let first = refund_agent(ScriptedModel::new(vec![call("refund", r#"{"order":42,"amount":99}"#)]), refund_tool(), store.clone());
    let paused = block_on(first.run("Refund order 42", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    let records = records_of(&store);
    // A call without one is stored as before the field existed: nothing is added to it.
    let stored = serde_json::to_string(&records).unwrap();
    assert!(stored.contains(r#""arguments":"{\"order\":42,\"amount\":99}""#) && !stored.contains("providerData"), "{stored}");

    let model = ScriptedModel::new(vec![text("Refunded order 42.")]);
    let agent = refund_agent(model.clone(), refund_tool(), store_with(records));
    let decisions = [ApprovalDecision { id: paused.pending_approvals[0].id.clone(), approved: true, reason: None }];
    let out = block_on(agent.resume(&paused.run_id, &decisions, None, &mut CollectingSink::default())).unwrap();
    assert_eq!(out.status, RunStatus::Completed);
    let calls: Vec<_> = model.requests.borrow()[0]
        .messages
        .iter()
        .filter_map(|m| if let Message::Assistant { tool_calls, .. } = m { tool_calls.first().cloned() } else { None })
        .collect();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].provider_data, None);
}

/// A memory store whose writes fail with `store_quota` while `full` is set, and which records
/// what it writes: bytes of JSON per key, puts and batches alike (a test double).
#[derive(Default)]
struct FillingStore {
    inner: MemoryStore,
    full: std::cell::Cell<bool>,
    written: std::cell::RefCell<Vec<(String, usize)>>,
}

impl FillingStore {
    fn refuse_while_full(&self) -> Result<(), crucible::store::StoreError> {
        if self.full.get() {
            return Err(crucible::store::StoreError::new("store_quota", "the disk is full"));
        }
        Ok(())
    }
}

#[async_trait::async_trait(?Send)]
impl Store for FillingStore {
    async fn get(&self, key: &str) -> Result<Option<Value>, crucible::store::StoreError> {
        self.inner.get(key).await
    }
    async fn put(&self, key: &str, value: Value) -> Result<(), crucible::store::StoreError> {
        self.refuse_while_full()?;
        self.written.borrow_mut().push((key.to_string(), value.to_string().len()));
        self.inner.put(key, value).await
    }
    async fn delete(&self, key: &str) -> Result<(), crucible::store::StoreError> {
        self.refuse_while_full()?;
        self.inner.delete(key).await
    }
    async fn scan(&self, prefix: &str) -> Result<Vec<(String, Value)>, crucible::store::StoreError> {
        self.inner.scan(prefix).await
    }
    async fn batch(&self, ops: Vec<crucible::store::BatchOp>) -> Result<(), crucible::store::StoreError> {
        self.refuse_while_full()?;
        for op in &ops {
            if let crucible::store::BatchOp::Put { key, value } = op {
                self.written.borrow_mut().push((key.clone(), value.to_string().len()));
            }
        }
        self.inner.batch(ops).await
    }
}

#[test]
fn a_resume_whose_save_failed_after_the_approved_call_resumes_here_as_it_would_after_a_restart() {
    let store = Rc::new(FillingStore::default());
    let refunds = refund_tool();
    let handler = Rc::new(NeedsApproval { inner: refunds.clone(), predicate: Box::new(|_: &Value| true) });
    let mut tools = ToolSet::new();
    tools.insert(Tool::new("refund", "Refund an order", &json!({ "type": "object" }), None, handler).unwrap());
    let model = ScriptedModel::new(vec![call("refund", r#"{"order":42}"#), text("Refunded."), text("Refunded.")]);
    let agent = Agent::new(AgentConfig::default(), model, tools, Rc::new(NativeEnvironment::default())).unwrap().with_store(store.clone(), "bot");
    let paused = block_on(agent.run("Refund order 42", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    let decisions = [ApprovalDecision { id: paused.pending_approvals[0].id.clone(), approved: true, reason: None }];
    store.full.set(true);
    let err = block_on(agent.resume(&paused.run_id, &decisions, None, &mut CollectingSink::default())).unwrap_err();
    assert_eq!((err.code(), refunds.calls.get()), ("store_quota".to_string(), 1));
    // The store still holds the paused step: its call runs again on resume (at least once, as
    // after a crash there), in this process as in the next, not only in the next.
    store.full.set(false);
    let listed = block_on(agent.stored_runs()).unwrap();
    assert_eq!(listed.len(), 1);
    let out = block_on(agent.resume(&paused.run_id, &decisions, None, &mut CollectingSink::default())).unwrap();
    assert_eq!((out.status, refunds.calls.get()), (RunStatus::Completed, 2));
    // Resumed to its end: the kept state object is refused by the store.
    let again = block_on(agent.resume_state(paused.state.clone().unwrap(), &decisions, None, &mut CollectingSink::default())).unwrap_err();
    assert_eq!(again.code(), "invalid_resume");
}

#[test]
fn a_resume_aborted_before_it_starts_reports_the_runs_usage_and_runs_nothing() {
    let store = Rc::new(MemoryStore::new());
    let refunds = refund_tool();
    let model = ScriptedModel::new(vec![call("refund", r#"{"order":42,"amount":99}"#), text("Refunded.")]);
    let agent = refund_agent(model, refunds.clone(), store);
    let paused = block_on(agent.run("refund 42", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    assert_eq!(paused.status, RunStatus::Paused);
    assert!(paused.usage.input_tokens > 0, "{:?}", paused.usage);
    let decisions = vec![ApprovalDecision { id: paused.pending_approvals[0].id.clone(), approved: true, reason: None }];
    let flag = Rc::new(CancelFlag::default());
    flag.cancel();
    let mut sink = CollectingSink::default();
    assert_eq!(block_on(agent.resume(&paused.run_id, &decisions, Some(flag), &mut sink)).unwrap_err(), AgentError::Aborted);
    assert_eq!(refunds.calls.get(), 0, "nothing ran");
    // As an aborted run() does, it ends with `agent.error` and the usage the run had (a host
    // rejecting with it reads `error.usage`).
    match &sink.events[..] {
        [event] => match &event.body {
            EventBody::AgentError { error, usage } => {
                assert_eq!(error.code, "aborted");
                assert_eq!(usage, &paused.usage);
                assert_eq!(event.run_id, paused.run_id);
            }
            other => panic!("{other:?}"),
        },
        events => panic!("{events:?}"),
    }
    // Still paused: a later resume runs the approved refund.
    let done = block_on(agent.resume(&paused.run_id, &decisions, None, &mut CollectingSink::default())).unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(refunds.calls.get(), 1);
}

/// A run's starting conversation (the session's, the same at every step) is written once, not
/// with every step's state; a run paused in such a session resumes after a restart with the
/// whole conversation, and a finished or discarded run leaves neither record behind.
#[test]
fn a_runs_starting_conversation_is_written_once_and_read_back_whole() {
    let store = Rc::new(FillingStore::default());
    let big = "x".repeat(100_000);
    let refunds = refund_tool();
    let handler = Rc::new(NeedsApproval { inner: refunds.clone(), predicate: Box::new(|args: &Value| args["order"] == 9) });
    let tools = || {
        let mut tools = ToolSet::new();
        tools.insert(Tool::new("refund", "Refund an order", &json!({ "type": "object" }), None, handler.clone()).unwrap());
        tools
    };
    let calls: Vec<_> = (1..=5).map(|order| call("refund", &format!(r#"{{"order":{order}}}"#))).collect();
    let model = ScriptedModel::new([vec![text(&big)], calls, vec![call("refund", r#"{"order":9}"#)]].concat());
    let agent = Agent::new(AgentConfig::default(), model.clone(), tools(), Rc::new(NativeEnvironment::default())).unwrap().with_store(store.clone(), "bot");
    block_on(agent.run(&big, RunOptions::default(), &mut CollectingSink::default())).unwrap();
    store.written.borrow_mut().clear();
    // Six steps in a session holding 200 KB: the 200 KB are written once, not seven times.
    let paused = block_on(agent.run("refund them", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    assert_eq!(paused.status, RunStatus::Paused);
    let written = store.written.borrow().clone();
    let history: Vec<_> = written.iter().filter(|(key, _)| key.contains("/run-history/")).collect();
    assert_eq!(history.len(), 1, "{written:?}");
    assert!(history[0].1 > 200_000);
    let states: usize = written.iter().filter(|(key, _)| key.contains("/run/")).map(|(_, bytes)| bytes).sum();
    assert!(written.iter().filter(|(key, _)| key.contains("/run/")).count() >= 6 && states < 20_000, "the states carry no conversation: {written:?}");
    // After a restart: the resumed run sends the whole conversation.
    let reply = ScriptedModel::new(vec![text("Refunded.")]);
    let restarted = Agent::new(AgentConfig::default(), reply.clone(), tools(), Rc::new(NativeEnvironment::default())).unwrap().with_store(store.clone(), "bot");
    let decisions = [ApprovalDecision { id: paused.pending_approvals[0].id.clone(), approved: true, reason: None }];
    let out = block_on(restarted.resume(&paused.run_id, &decisions, None, &mut CollectingSink::default())).unwrap();
    assert_eq!(out.status, RunStatus::Completed);
    let sent = &reply.requests.borrow()[0].messages;
    assert!(
        sent.iter().filter(|m| matches!(m, Message::User { content } | Message::Assistant { content, .. } if content == &big)).count() == 2,
        "{} messages",
        sent.len()
    );
    assert!(block_on(store.inner.scan("agent/bot/")).unwrap().iter().all(|(key, _)| !key.contains("/run")), "nothing of the run is left");
}

/// A stored state claiming more starting conversation than it holds (a record another writer
/// got wrong) is saved whole at every step: splitting it anew at each save dropped a message
/// between the history written once and the later states.
#[test]
fn a_state_claiming_more_history_than_messages_loses_none_of_them() {
    let store = Rc::new(MemoryStore::new());
    let refunds = refund_tool();
    let handler = Rc::new(NeedsApproval { inner: refunds.clone(), predicate: Box::new(|_: &Value| true) });
    let tools = || {
        let mut tools = ToolSet::new();
        tools.insert(Tool::new("refund", "Refund an order", &json!({ "type": "object" }), None, handler.clone()).unwrap());
        tools
    };
    let model = ScriptedModel::new(vec![call("refund", r#"{"order":1}"#), call("refund", r#"{"order":2}"#), text("Done.")]);
    let agent = Agent::new(AgentConfig::default(), model.clone(), tools(), Rc::new(NativeEnvironment::default())).unwrap().with_store(store.clone(), "bot");
    let paused = block_on(agent.run("refund both", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    let key = format!("agent/bot/run/{}", paused.run_id);
    let mut record = block_on(store.get(&key)).unwrap().unwrap();
    assert_eq!(record["data"]["messages"].as_array().unwrap().len(), 2);
    record["data"]["historyLen"] = json!(5);
    block_on(store.put(&key, record)).unwrap();
    let restarted = Agent::new(AgentConfig::default(), model, tools(), Rc::new(NativeEnvironment::default())).unwrap().with_store(store.clone(), "bot");
    let decide = |out: &crucible::agent::RunOutput| [ApprovalDecision { id: out.pending_approvals[0].id.clone(), approved: true, reason: None }];
    let again = block_on(restarted.resume(&paused.run_id, &decide(&paused), None, &mut CollectingSink::default())).unwrap();
    assert_eq!(again.status, RunStatus::Paused, "the second call waits too");
    let stored = block_on(restarted.load_run(&paused.run_id)).unwrap();
    assert_eq!(stored.messages, again.state.unwrap().messages, "the stored state holds every message");
}

/// A starting conversation whose state record is gone (deleted by a build that knew only the
/// state) is deleted by `discard_run` all the same, not kept where nothing lists it.
#[test]
fn discarding_a_run_deletes_its_starting_conversation_even_without_its_state() {
    let store = Rc::new(MemoryStore::new());
    let handler = Rc::new(NeedsApproval { inner: refund_tool(), predicate: Box::new(|_: &Value| true) });
    let mut tools = ToolSet::new();
    tools.insert(Tool::new("refund", "Refund an order", &json!({ "type": "object" }), None, handler).unwrap());
    let model = ScriptedModel::new(vec![text("Hello."), call("refund", r#"{"order":1}"#)]);
    let agent = Agent::new(AgentConfig::default(), model, tools, Rc::new(NativeEnvironment::default())).unwrap().with_store(store.clone(), "bot");
    block_on(agent.run("hi", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    let paused = block_on(agent.run("refund it", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    let history = format!("agent/bot/run-history/{}", paused.run_id);
    assert!(block_on(store.get(&history)).unwrap().is_some(), "the session's conversation is stored apart");
    block_on(store.delete(&format!("agent/bot/run/{}", paused.run_id))).unwrap();
    assert!(!block_on(agent.discard_run(&paused.run_id)).unwrap(), "there was no state");
    assert_eq!(block_on(store.get(&history)).unwrap(), None);
}

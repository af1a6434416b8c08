//! Durable runs: approval pauses, resume (from the returned state or the store), denials fed
//! back to the model, and recovery of a run interrupted between steps.

mod support;

use std::rc::Rc;

use crucible::agent::{Agent, AgentConfig, AgentError, ApprovalDecision, CollectingSink, EventBody, NativeEnvironment, RunOptions, RunStatus};
use crucible::model::Message;
use crucible::store::{MemoryStore, Store};
use crucible::tools::{Tool, ToolSet};
use futures::executor::block_on;
use serde_json::{json, Value};
use support::*;

fn refund_agent(model: Rc<ScriptedModel>, refunds: Rc<FnTool>, store: Rc<MemoryStore>) -> Agent {
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
    Agent::new(AgentConfig::default(), model, tools, Rc::new(NativeEnvironment::default())).unwrap().with_store(store, "support-bot")
}

fn refund_tool() -> Rc<FnTool> {
    FnTool::new(|args| Ok(json!({ "refunded": args["order"] })))
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

    let model = ScriptedModel::new(vec![text("Refunded order 7.")]);
    let restarted = refund_agent(model.clone(), refunds.clone(), store);
    let out = block_on(restarted.resume("run_crash", &[], None, &mut CollectingSink::default())).unwrap();
    assert_eq!(out.text, "Refunded order 7.");
    assert_eq!(refunds.calls.get(), 1, "the persisted step is not executed twice");
    assert_eq!((out.turns, out.steps), (2, 1));
}

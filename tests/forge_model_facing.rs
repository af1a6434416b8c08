//! What the model reads in a `forge_tool` result, as against what the host reads: a judge
//! provider's error (keys, internal hosts, paths) stays with the host, and a call cut off at
//! the token limit is told so.

mod support;

use std::rc::Rc;

use crucible::agent::{Agent, AgentConfig, CollectingSink, EventBody, NativeEnvironment, RunOptions, ToolProvider};
use crucible::model::{Message, ModelError};
use crucible::registry::EmergentConfig;
use crucible::store::MemoryStore;
use futures::executor::block_on;
use serde_json::{json, Value};
use support::emergent::*;
use support::{call, cut_off, text, Reply, ScriptedModel};

const SECRET: &str = "sk-live-SECRET123";
const INTERNAL: &str = "judge-7.corp.internal /srv/keys/judge.pem";

fn agent_with_registry(model: Rc<ScriptedModel>, rig: &Rig) -> Agent {
    let agent = Agent::new(AgentConfig::default(), model, host_tools(), Rc::new(NativeEnvironment::default())).unwrap();
    agent.set_tool_provider(Some(rig.registry.clone() as Rc<dyn ToolProvider>));
    agent
}

fn run(agent: &Agent) {
    let options = RunOptions { session_id: Some("s1".into()), ..Default::default() };
    block_on(agent.run("?", options, &mut CollectingSink::default())).unwrap();
}

/// The tool result the model was sent last in request `request`, as text and as JSON.
fn tool_result(model: &ScriptedModel, request: usize) -> (String, Value) {
    let requests = model.requests.borrow();
    let Some(Message::Tool { content, .. }) = requests[request].messages.last() else { panic!("no tool result in request {request}") };
    (content.clone(), serde_json::from_str(content).unwrap())
}

fn rig_judged_by(judge: Rc<ScriptedModel>) -> Rig {
    rig_with(EmergentConfig::default(), Some(judge), Some(approving_judge()), Rc::new(MemoryStore::new()))
}

/// The model forges slugify once, with `judge` failing as `failure`; returns what the model read.
fn forge_in_a_run(failure: ModelError) -> (Rig, String, Value) {
    let r = rig_judged_by(judge_replying(vec![Reply::Fail(failure)]));
    let model = ScriptedModel::new(vec![call("forge_tool", &slugify_request("slugify", SLUGIFY_JS).to_string()), text("done")]);
    run(&agent_with_registry(model.clone(), &r));
    let (content, result) = tool_result(&model, 1);
    (r, content, result)
}

fn provider_failures() -> Vec<ModelError> {
    vec![
        ModelError::new("provider_http", format!("401: Incorrect API key provided: {SECRET}. internal host {INTERNAL}")),
        ModelError::new("provider_network", "connect ECONNREFUSED 127.0.0.1:45999 (http://127.0.0.1:45999/private-judge/v1)"),
        ModelError::new("provider_error", "ECONNREFUSED /home/ops/.config/judge-secrets.json at JudgeClient.call (/srv/app/index.js:42:7)"),
        ModelError::new("provider_timeout", "no answer from http://judge-7.corp.internal/v1 within 3000 ms"),
    ]
}

#[test]
fn a_judge_provider_failure_reaches_the_model_as_a_fixed_reason() {
    for failure in provider_failures() {
        let detail = failure.message.clone();
        let (_, content, result) = forge_in_a_run(failure);
        assert_eq!(result["success"], false);
        assert_eq!(result["category"], "other");
        assert!(result["reason"].as_str().unwrap().contains("the reviewer was unavailable"), "{content}");
        for leaked in [detail.as_str(), SECRET, "corp.internal", "127.0.0.1", "/srv/", "/home/"] {
            assert!(!content.contains(leaked), "{leaked:?} reached the model: {content}");
        }
        assert!(result.get("hint").is_none(), "nothing in the request to fix: {content}");
    }
}

#[test]
fn the_host_keeps_the_judge_providers_error_in_its_result_event_and_audit() {
    let failure = ModelError::new("provider_http", format!("401: Incorrect API key provided: {SECRET}"));
    // `agent.forge()`: the host's own call reads what happened.
    let r = rig_judged_by(judge_replying(vec![Reply::Fail(failure.clone())]));
    let res = block_on(r.registry.forge(&slugify_request("slugify", SLUGIFY_JS), "s1"));
    assert!(res.reason.as_deref().unwrap().contains(SECRET), "{res:?}");
    let serialized = serde_json::to_value(&res).unwrap();
    assert!(serialized["reason"].as_str().unwrap().contains(SECRET), "the host API's result is serialized whole: {serialized}");

    // In a run: the event and the audit entry keep it, the model's result does not.
    let (r, content, _) = forge_in_a_run(failure);
    assert!(!content.contains(SECRET), "{content}");
    let rejected = r.events.bodies().into_iter().find_map(|b| match b {
        EventBody::ForgeRejected { reason, .. } => Some(reason),
        _ => None,
    });
    assert!(rejected.unwrap().contains(SECRET));
    let entry = r.registry.audit_trail().into_iter().find(|a| a.action == "reject").unwrap();
    assert!(entry.detail.contains(SECRET), "{entry:?}");
}

#[test]
fn without_a_judge_the_model_is_told_no_forge_can_pass_not_to_fix_its_request() {
    let r = rig_with(EmergentConfig::default(), None, None, Rc::new(MemoryStore::new()));
    let model = ScriptedModel::new(vec![call("forge_tool", &slugify_request("slugify", SLUGIFY_JS).to_string()), text("done")]);
    run(&agent_with_registry(model.clone(), &r));
    let (content, result) = tool_result(&model, 1);
    assert_eq!((result["success"].clone(), result["category"].clone()), (json!(false), json!("other")), "{content}");
    assert!(result["reason"].as_str().unwrap().contains("no reviewer configured") && content.contains("do not call forge_tool again"), "{content}");
    assert!(result.get("hint").is_none(), "nothing in the request to fix: {content}");
    // The host reads what happened.
    let entry = r.registry.audit_trail().into_iter().find(|a| a.action == "reject").unwrap();
    assert!(entry.detail.contains("no judge is configured"), "{entry:?}");
}

#[test]
fn a_judge_answer_that_is_no_verdict_stays_readable_to_the_model() {
    let r = rig_judged_by(judge_replying(vec![text("I would rather not say.")]));
    let model = ScriptedModel::new(vec![call("forge_tool", &slugify_request("slugify", SLUGIFY_JS).to_string()), text("done")]);
    run(&agent_with_registry(model.clone(), &r));
    let (content, result) = tool_result(&model, 1);
    assert_eq!(result["category"], "parse_error");
    assert!(result["reason"].as_str().unwrap().contains("contains no valid JSON verdict"), "{content}");
    assert!(result["hint"].is_string(), "{content}");
}

#[test]
fn a_forge_tool_call_cut_off_at_the_token_limit_is_told_so() {
    let r = rig();
    let request = slugify_request("slugify", SLUGIFY_JS).to_string();
    let cut = &request[..150];
    let model = ScriptedModel::new(vec![cut_off(&[("forge_tool", cut)]), text("done")]);
    run(&agent_with_registry(model.clone(), &r));
    let (content, result) = tool_result(&model, 1);
    assert_eq!(result["category"], "parse_error", "{content}");
    let reason = result["reason"].as_str().unwrap();
    assert!(reason.contains("could not parse the forge request"), "{content}");
    assert!(reason.contains("the answer stopped at its token limit (finish reason `length`) inside these arguments"), "{content}");

    // The same broken call in an answer that was not cut off gets no such note.
    let model = ScriptedModel::new(vec![call("forge_tool", cut), text("done")]);
    run(&agent_with_registry(model.clone(), &rig()));
    let (content, result) = tool_result(&model, 1);
    assert_eq!(result["category"], "parse_error", "{content}");
    assert!(!content.contains("token limit"), "{content}");
}

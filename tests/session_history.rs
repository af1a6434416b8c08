//! A session's conversation stays within `sessionHistory`: the oldest whole exchanges go first.

mod support;

use std::rc::Rc;

use crucible::agent::{Agent, AgentConfig, CollectingSink, HistoryLimits, NativeEnvironment, RunOptions, DEFAULT_HISTORY_MAX_BYTES};
use crucible::model::Message;
use crucible::tools::{Tool, ToolSet};
use futures::executor::block_on;
use serde_json::json;
use support::*;

/// An agent whose `page` tool returns `result_bytes` characters.
fn agent(model: Rc<ScriptedModel>, result_bytes: usize, limits: HistoryLimits) -> Agent {
    let mut tools = ToolSet::new();
    let page = FnTool::new(move |_| Ok(json!({ "text": "x".repeat(result_bytes) })));
    tools.insert(Tool::new("page", "A page", &json!({ "type": "object" }), None, page).unwrap());
    let config = AgentConfig { session_history: limits, max_result_bytes: 1 << 20, ..AgentConfig::default() };
    Agent::new(config, model, tools, Rc::new(NativeEnvironment::default())).unwrap()
}

fn run(agent: &Agent, input: &str) {
    block_on(agent.run(input, RunOptions { session_id: Some("s".into()), ..Default::default() }, &mut CollectingSink::default())).unwrap();
}

/// The user messages of `history`, in order.
fn inputs(history: &[Message]) -> Vec<String> {
    history
        .iter()
        .filter_map(|m| match m {
            Message::User { content } => Some(content.clone()),
            _ => None,
        })
        .collect()
}

/// Starts with a user message, and every tool result follows the assistant message that called it.
fn well_formed(history: &[Message]) -> bool {
    let mut called = vec![];
    matches!(history.first(), Some(Message::User { .. }))
        && history.iter().all(|m| match m {
            Message::Assistant { tool_calls, .. } => {
                called = tool_calls.iter().map(|c| c.id.clone()).collect();
                true
            }
            Message::Tool { tool_call_id, .. } => called.contains(tool_call_id),
            _ => true,
        })
}

fn json_bytes(history: &[Message]) -> usize {
    history.iter().map(|m| serde_json::to_string(m).unwrap().len()).sum()
}

#[test]
fn by_default_history_is_bounded_in_bytes_only() {
    assert_eq!(HistoryLimits::default(), HistoryLimits { max_messages: None, max_bytes: DEFAULT_HISTORY_MAX_BYTES });
    assert_eq!(DEFAULT_HISTORY_MAX_BYTES, 8 * 1024 * 1024);
    let model = ScriptedModel::repeating(text("ok"));
    let agent = agent(model, 0, HistoryLimits::default());
    for i in 0..50 {
        run(&agent, &format!("q{i}"));
    }
    assert_eq!(agent.history("s").len(), 100, "no count bound by default");
}

#[test]
fn past_max_messages_the_fewest_oldest_whole_exchanges_are_dropped() {
    // Run 1 is a tool exchange (4 messages), runs 2 and 3 plain answers (2 each).
    let model = ScriptedModel::new(vec![call("page", "{}"), text("one"), text("two"), text("three")]);
    let agent = agent(model.clone(), 10, HistoryLimits { max_messages: Some(5), ..HistoryLimits::default() });
    run(&agent, "q1");
    assert_eq!(agent.history("s").len(), 4);
    run(&agent, "q2");
    // 6 messages: dropping q1's exchange whole (never its tool result alone) leaves 2.
    let history = agent.history("s");
    assert_eq!(inputs(&history), ["q2"]);
    assert_eq!(history.len(), 2);
    run(&agent, "q3");
    assert_eq!(inputs(&agent.history("s")), ["q2", "q3"], "4 messages fit: nothing more is dropped");
    // What run 3 sent the model was the bounded conversation.
    let sent = &model.requests.borrow()[3].messages;
    assert_eq!(inputs(sent), ["q2", "q3"]);
}

#[test]
fn past_max_bytes_the_history_stays_under_the_bound_with_tool_pairs_whole() {
    let model = ScriptedModel::new((0..20).flat_map(|i| [call("page", "{}"), text(&format!("answer {i}"))]).collect());
    let max_bytes = 5_000;
    let agent = agent(model.clone(), 1_000, HistoryLimits { max_bytes, ..HistoryLimits::default() });
    for i in 0..20 {
        run(&agent, &format!("q{i}"));
        let history = agent.history("s");
        assert!(json_bytes(&history) as u64 <= max_bytes, "run {i}: {} bytes", json_bytes(&history));
        assert!(well_formed(&history), "run {i}: {history:?}");
        assert_eq!(inputs(&history).last().unwrap(), &format!("q{i}"), "the run's own exchange is kept");
    }
    // About 1.1 KB per exchange: four of them fit, the fifth would not.
    assert_eq!(inputs(&agent.history("s")), ["q16", "q17", "q18", "q19"]);
    // Each run sent the model no more than the bound plus its own input.
    let largest_sent = model.requests.borrow().iter().map(|r| json_bytes(&r.messages)).max().unwrap();
    assert!(largest_sent < 5_000 + 2_500, "{largest_sent} bytes");
}

#[test]
fn an_exchange_larger_than_the_bound_is_kept_whole() {
    let model = ScriptedModel::new(vec![text("small"), call("page", "{}"), text("big done"), text("after")]);
    let agent = agent(model, 10_000, HistoryLimits { max_bytes: 1_000, ..HistoryLimits::default() });
    run(&agent, "small");
    run(&agent, "big");
    let history = agent.history("s");
    assert_eq!(inputs(&history), ["big"], "older exchanges go, the run's own stays whole");
    assert_eq!(history.len(), 4);
    assert!(matches!(&history[2], Message::Tool { content, .. } if content.len() > 10_000));
    // The next run drops it: its own exchange fits.
    run(&agent, "after");
    assert_eq!(inputs(&agent.history("s")), ["after"]);
}

#[test]
fn bounds_no_run_could_keep_are_invalid_config() {
    let make = |limits| {
        Agent::new(
            AgentConfig { session_history: limits, ..AgentConfig::default() },
            ScriptedModel::repeating(text("x")),
            ToolSet::new(),
            Rc::new(NativeEnvironment::default()),
        )
    };
    let err = make(HistoryLimits { max_bytes: 0, ..HistoryLimits::default() }).unwrap_err();
    assert_eq!((err.code(), err.to_string()), ("invalid_config".into(), "invalid configuration: sessionHistory.maxBytes must be at least 1".into()));
    let err = make(HistoryLimits { max_messages: Some(0), ..HistoryLimits::default() }).unwrap_err();
    assert!(err.to_string().contains("sessionHistory.maxMessages must be at least 1"), "{err}");
    // Read from the options' JSON, camelCase, defaults filled in.
    let config: AgentConfig = serde_json::from_value(json!({ "sessionHistory": { "maxMessages": 40 } })).unwrap();
    assert_eq!(config.session_history, HistoryLimits { max_messages: Some(40), max_bytes: DEFAULT_HISTORY_MAX_BYTES });
}

#[test]
fn a_structured_output_retry_is_not_taken_for_an_exchange_of_its_own() {
    // Run 1's first answer fails `returns`: the core's reminder is a user message inside run
    // 1's exchange, not the start of another one.
    let model = ScriptedModel::new(vec![text("not json"), text("{\"n\":1}"), text("{\"n\":2}")]);
    let schema = json!({ "type": "object", "required": ["n"] });
    let config =
        AgentConfig { returns: Some(schema), session_history: HistoryLimits { max_messages: Some(5), ..HistoryLimits::default() }, ..AgentConfig::default() };
    let agent = Agent::new(config, model.clone(), ToolSet::new(), Rc::new(NativeEnvironment::default())).unwrap();
    run(&agent, "q1");
    assert_eq!(agent.history("s").len(), 4, "q1, its bad answer, the reminder, the good answer");
    run(&agent, "q2");
    // 6 messages: run 1's exchange goes whole, not down to its reminder and second answer.
    let history = agent.history("s");
    assert_eq!(history, [Message::User { content: "q2".into() }, Message::Assistant { content: "{\"n\":2}".into(), tool_calls: vec![] }]);
}

#[test]
fn a_run_completing_after_later_runs_trimmed_its_start_adds_its_exchange_whole_after_theirs() {
    // Run A calls a slow tool; runs B then C start after it and complete first, and C's trim
    // drops what A started from.
    let model = ScriptedModel::new(vec![text("zero"), call("page", "{}"), text("b"), text("c"), text("a"), text("d")]);
    let mut tools = ToolSet::new();
    let slow = FnTool::with_delay(|_| Ok(json!({ "text": "p" })), |_| 50);
    tools.insert(Tool::new("page", "A page", &json!({ "type": "object" }), None, slow).unwrap());
    let config = AgentConfig { session_history: HistoryLimits { max_messages: Some(4), ..HistoryLimits::default() }, ..AgentConfig::default() };
    let agent = Agent::new(config, model.clone(), tools, Rc::new(NativeEnvironment::default())).unwrap();
    run(&agent, "q0");
    let in_s = || RunOptions { session_id: Some("s".into()), ..Default::default() };
    let (mut sa, mut sb) = (CollectingSink::default(), CollectingSink::default());
    let a = agent.run("qA", in_s(), &mut sa);
    let b_then_c = async {
        agent.run("qB", in_s(), &mut sb).await.unwrap();
        assert_eq!(inputs(&agent.history("s")), ["q0", "qB"]);
        agent.run("qC", in_s(), &mut CollectingSink::default()).await.unwrap();
        assert_eq!(inputs(&agent.history("s")), ["qB", "qC"], "C's trim dropped q0, where A started");
    };
    let (a, ()) = block_on(futures::future::join(a, b_then_c));
    a.unwrap();
    let history = agent.history("s");
    assert_eq!(inputs(&history), ["qA"], "A's exchange (4 messages) is kept whole, and alone fills the bound");
    assert_eq!(history.len(), 4);
    assert!(well_formed(&history));
    // The next run sends the model what history() shows.
    run(&agent, "qD");
    let sent = model.requests.borrow().last().unwrap().messages.clone();
    assert_eq!(inputs(&sent), ["qA", "qD"]);
}

#[test]
fn a_providers_value_for_a_call_is_handed_back_on_the_sessions_later_runs() {
    let echo = json!({ "extra_content": { "google": { "thought_signature": "CrIC" } } });
    let model = ScriptedModel::new(vec![call_with_data("page", "{}", echo.clone()), text("Read it."), text("ok")]);
    let agent = agent(model.clone(), 10, HistoryLimits::default());
    run(&agent, "Read the page");
    run(&agent, "Thanks");
    let later = model.requests.borrow()[2].clone();
    let sent: Vec<_> = later
        .messages
        .iter()
        .filter_map(|m| if let Message::Assistant { tool_calls, .. } = m { tool_calls.first() } else { None })
        .map(|c| c.provider_data.clone())
        .collect();
    assert_eq!(sent, [Some(echo)]);
}

//! The agent loop, specified through a scripted test-double model.

mod support;

use std::rc::Rc;

use crucible::agent::{Agent, AgentConfig, AgentError, CancelFlag, CollectingSink, EventBody, NativeEnvironment, RunOptions, RunStatus};
use crucible::model::{Message, ModelError, ResponseFormat};
use crucible::tools::{Tool, ToolFailure, ToolSet};
use futures::executor::block_on;
use serde_json::{json, Value};
use support::*;

fn weather_tool(handler: Rc<FnTool>) -> Tool {
    Tool::new(
        "get_weather",
        "Current temperature for a city",
        &json!({ "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] }),
        None,
        handler,
    )
    .unwrap()
}

fn agent_with(model: Rc<ScriptedModel>, tools: Vec<Tool>, config: AgentConfig) -> Agent {
    let mut set = ToolSet::new();
    for t in tools {
        set.insert(t);
    }
    Agent::new(config, model, set, Rc::new(NativeEnvironment::default())).unwrap()
}

fn types(sink: &CollectingSink) -> Vec<&'static str> {
    sink.events
        .iter()
        .map(|e| match &e.body {
            EventBody::AgentStart { .. } => "agent.start",
            EventBody::StepStart { .. } => "step.start",
            EventBody::TextDelta { .. } => "text.delta",
            EventBody::ToolCall { .. } => "tool.call",
            EventBody::ToolExecuteStart { .. } => "tool.execute.start",
            EventBody::ToolExecuteEnd { .. } => "tool.execute.end",
            EventBody::ToolExecuteError { .. } => "tool.execute.error",
            EventBody::StepEnd { .. } => "step.end",
            EventBody::OutputRetry { .. } => "output.retry",
            EventBody::AgentEnd { .. } => "agent.end",
            EventBody::AgentError { .. } => "agent.error",
            EventBody::ApprovalRequested { .. } => "approval.requested",
            EventBody::AgentPaused { .. } => "agent.paused",
            EventBody::ForgeStart { .. } => "forge.start",
            EventBody::ForgeTest { .. } => "forge.test",
            EventBody::ForgeJudge { .. } => "forge.judge",
            EventBody::ForgeRegistered { .. } => "forge.registered",
            EventBody::ForgeRejected { .. } => "forge.rejected",
            EventBody::ToolPromoted { .. } => "tool.promoted",
            EventBody::ToolDemoted { .. } => "tool.demoted",
            EventBody::PromotionRejected { .. } => "promotion.rejected",
            EventBody::RegistryReloaded { .. } => "registry.reloaded",
        })
        .filter(|t| *t != "text.delta")
        .collect()
}

/// The calls whose `tool.execute.end` the run reported, in the order it reported them.
fn ended_calls(sink: &CollectingSink) -> Vec<String> {
    sink.events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::ToolExecuteEnd { call_id, .. } => Some(call_id.clone()),
            _ => None,
        })
        .collect()
}

fn tool_errors(sink: &CollectingSink) -> Vec<ToolFailure> {
    sink.events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::ToolExecuteError { error, .. } => Some(error.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn answers_without_tools_and_streams_text_deltas() {
    let model = ScriptedModel::new(vec![text("Hello there, Oslo!")]);
    let agent = agent_with(model, vec![], AgentConfig::default());
    let mut sink = CollectingSink::default();
    let out = block_on(agent.run("hi", RunOptions::default(), &mut sink)).unwrap();
    assert_eq!(out.output, json!("Hello there, Oslo!"));
    let deltas: String = sink
        .events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::TextDelta { delta, .. } => Some(delta.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deltas, "Hello there, Oslo!");
    assert_eq!(types(&sink), ["agent.start", "step.start", "step.end", "agent.end"]);
    assert!(sink.events.iter().all(|e| e.run_id == out.run_id && e.run_path == vec![out.run_id.clone()]));
}

#[test]
fn calls_a_tool_feeds_the_result_back_and_finishes() {
    let weather = FnTool::new(|args| Ok(json!({ "city": args["city"], "celsius": 21 })));
    let model = ScriptedModel::new(vec![call("get_weather", r#"{"city":"Oslo"}"#), text("It is 21 °C in Oslo.")]);
    let agent = agent_with(model.clone(), vec![weather_tool(weather.clone())], AgentConfig { instructions: "Be concise.".into(), ..Default::default() });
    let mut sink = CollectingSink::default();
    let out = block_on(agent.run("Weather in Oslo?", RunOptions::default(), &mut sink)).unwrap();
    assert_eq!(out.text, "It is 21 °C in Oslo.");
    assert_eq!((out.turns, out.steps), (2, 1));
    assert_eq!(
        types(&sink),
        ["agent.start", "step.start", "tool.call", "tool.execute.start", "tool.execute.end", "step.end", "step.start", "step.end", "agent.end"]
    );
    let requests = model.requests.borrow();
    assert_eq!(requests[0].messages[0], Message::System { content: "Be concise.".into() });
    assert_eq!(requests[0].tools[0].name, "get_weather");
    let Message::Tool { content, tool_call_id, is_error, .. } = requests[1].messages.last().unwrap() else { panic!("last message is not a tool result") };
    assert_eq!(tool_call_id, "call_0");
    assert!(!is_error);
    assert_eq!(serde_json::from_str::<Value>(content).unwrap(), json!({ "city": "Oslo", "celsius": 21 }));
}

#[test]
fn invalid_arguments_become_an_error_result_and_the_loop_goes_on() {
    let weather = FnTool::new(|_| Ok(json!({})));
    let model = ScriptedModel::new(vec![call("get_weather", r#"{"town":"Oslo"}"#), call("get_weather", "{not json"), text("Sorry.")]);
    let agent = agent_with(model.clone(), vec![weather_tool(weather.clone())], AgentConfig::default());
    let mut sink = CollectingSink::default();
    let out = block_on(agent.run("?", RunOptions::default(), &mut sink)).unwrap();
    assert_eq!(out.text, "Sorry.");
    assert_eq!(weather.calls.get(), 0, "execute must not run on invalid arguments");
    let errors = tool_errors(&sink);
    assert_eq!(errors.len(), 2);
    assert!(errors.iter().all(|e| e.code == "invalid_arguments"));
    assert!(errors[0].message.contains("city"), "{}", errors[0].message);
    let Message::Tool { content, is_error, .. } = &model.requests.borrow()[1].messages.last().unwrap().clone() else { panic!() };
    assert!(content.contains("invalid_arguments"));
    assert!(is_error, "a failed call's result is marked as an error for the provider");
}

#[test]
fn a_call_cut_off_at_the_token_limit_is_refused_with_the_reason() {
    let weather = FnTool::new(|_| Ok(json!({ "celsius": 21 })));
    let cut = cut_off(&[("get_weather", r#"{"city":"Oslo"}"#), ("get_weather", r#"{"city":"Li"#)]);
    let broken = call("get_weather", r#"{"city":"Li"#);
    let model = ScriptedModel::new(vec![cut, broken, text("Sorry.")]);
    let agent = agent_with(model, vec![weather_tool(weather.clone())], AgentConfig::default());
    let mut sink = CollectingSink::default();
    block_on(agent.run("?", RunOptions::default(), &mut sink)).unwrap();
    assert_eq!(weather.calls.get(), 1, "the complete call of the cut-off answer runs");
    let errors = tool_errors(&sink);
    assert_eq!(errors.len(), 2);
    assert!(errors[0].message.contains("token limit") && errors[0].message.contains("`length`"), "{}", errors[0].message);
    // The same broken arguments in an answer that was not cut off say nothing of a limit.
    assert!(errors[1].message.contains("not valid JSON") && !errors[1].message.contains("token limit"), "{}", errors[1].message);
}

#[test]
fn unknown_tools_and_throwing_tools_become_error_results() {
    let weather = FnTool::new(|_| Err(ToolFailure::new("execution_failed", "upstream weather service is down")));
    let long_name = "n".repeat(100_000);
    let model = ScriptedModel::new(vec![calls(&[(&long_name, "{}"), ("get_weather", r#"{"city":"Oslo"}"#)]), text("Could not.")]);
    let agent = agent_with(model, vec![weather_tool(weather)], AgentConfig::default());
    let mut sink = CollectingSink::default();
    block_on(agent.run("?", RunOptions::default(), &mut sink)).unwrap();
    let errors = tool_errors(&sink);
    assert_eq!(errors[0].code, "unknown_tool");
    assert!(errors[0].message.contains("get_weather"), "lists available tools: {}", errors[0].message);
    assert!(errors[0].message.len() < 200, "the model's name is quoted in part: {} bytes", errors[0].message.len());
    assert_eq!(errors[1].code, "execution_failed");
}

#[test]
fn calls_refused_as_unknown_or_with_invalid_arguments_still_send_their_providers_value_back() {
    // DeepSeek refuses a turn whose past tool-call message lacks its reasoning, refused call or not.
    let weather = FnTool::new(|_| Ok(json!({})));
    let unknown = json!({ "reasoning_content": "Try the forecast tool." });
    let invalid = json!({ "extra_content": { "google": { "thought_signature": "c2ln" } } });
    let model = ScriptedModel::new(vec![
        call_with_data("get_forecast", "{}", unknown.clone()),
        call_with_data("get_weather", "{not json", invalid.clone()),
        text("Sorry."),
    ]);
    let agent = agent_with(model.clone(), vec![weather_tool(weather)], AgentConfig::default());
    let mut sink = CollectingSink::default();
    block_on(agent.run("?", RunOptions::default(), &mut sink)).unwrap();
    assert_eq!(tool_errors(&sink).iter().map(|e| e.code.as_str()).collect::<Vec<_>>(), ["unknown_tool", "invalid_arguments"]);
    let sent: Vec<_> = model.requests.borrow()[2]
        .messages
        .iter()
        .filter_map(|m| if let Message::Assistant { tool_calls, .. } = m { tool_calls.first().map(|c| c.provider_data.clone()) } else { None })
        .collect();
    assert_eq!(sent, [Some(unknown), Some(invalid)]);
}

#[test]
fn oversized_results_are_refused_with_a_bounded_error() {
    let big = FnTool::new(|_| Ok(json!({ "blob": "x".repeat(5000) })));
    let model = ScriptedModel::new(vec![call("get_weather", r#"{"city":"Oslo"}"#), text("ok")]);
    let agent = agent_with(model.clone(), vec![weather_tool(big)], AgentConfig { max_result_bytes: 1000, ..Default::default() });
    let mut sink = CollectingSink::default();
    block_on(agent.run("?", RunOptions::default(), &mut sink)).unwrap();
    assert_eq!(tool_errors(&sink)[0].code, "result_too_large");
    let Message::Tool { content, .. } = model.requests.borrow()[1].messages.last().unwrap().clone() else { panic!() };
    assert!(content.len() < 1000);
}

#[test]
fn max_turns_ends_the_run_with_a_typed_error() {
    let weather = FnTool::new(|_| Ok(json!({})));
    let model = ScriptedModel::repeating(call("get_weather", r#"{"city":"Oslo"}"#));
    let agent = agent_with(model, vec![weather_tool(weather.clone())], AgentConfig { max_turns: 3, max_steps: 100, ..Default::default() });
    let mut sink = CollectingSink::default();
    let err = block_on(agent.run("?", RunOptions::default(), &mut sink)).unwrap_err();
    assert_eq!(err, AgentError::MaxTurnsExceeded { max: 3, calls_not_run: 1 });
    assert_eq!(err.code(), "max_turns_exceeded");
    assert!(matches!(&sink.events.last().unwrap().body, EventBody::AgentError { error, .. } if error.code == "max_turns_exceeded"));
    // The third turn's call had no turn left for its result: it was not executed.
    assert_eq!(weather.calls.get(), 2);
}

#[test]
fn tool_calls_of_the_last_turn_are_not_run_and_the_error_says_so() {
    let weather = FnTool::new(|_| Ok(json!({})));
    let two = calls(&[("get_weather", r#"{"city":"A"}"#), ("get_weather", r#"{"city":"B"}"#)]);
    let model = ScriptedModel::repeating(two);
    let agent = agent_with(model, vec![weather_tool(weather.clone())], AgentConfig { max_turns: 1, ..Default::default() });
    let mut sink = CollectingSink::default();
    let err = block_on(agent.run("?", RunOptions::default(), &mut sink)).unwrap_err();
    assert_eq!(err, AgentError::MaxTurnsExceeded { max: 1, calls_not_run: 2 });
    assert_eq!(weather.calls.get(), 0);
    let Some(EventBody::AgentError { error, .. }) = sink.events.last().map(|e| &e.body) else { panic!("ends with agent.error") };
    assert!(error.message.contains("the 2 tool calls its last answer asked for were not run"), "{}", error.message);
    // Nothing announces a call that never happens.
    assert_eq!(types(&sink), ["agent.start", "step.start", "agent.error"]);
}

#[test]
fn a_last_turn_that_also_passes_max_steps_runs_nothing_either() {
    let weather = FnTool::new(|_| Ok(json!({})));
    let two = calls(&[("get_weather", r#"{"city":"A"}"#), ("get_weather", r#"{"city":"B"}"#)]);
    let agent =
        agent_with(ScriptedModel::repeating(two), vec![weather_tool(weather.clone())], AgentConfig { max_turns: 1, max_steps: 1, ..Default::default() });
    let err = block_on(agent.run("?", RunOptions::default(), &mut CollectingSink::default())).unwrap_err();
    assert_eq!(err, AgentError::MaxStepsExceeded { max: 1, ran: 0, calls_not_run: 2 });
    assert_eq!(weather.calls.get(), 0);
}

#[test]
fn max_steps_counts_tool_calls_across_turns() {
    let weather = FnTool::new(|_| Ok(json!({})));
    let two = calls(&[("get_weather", r#"{"city":"A"}"#), ("get_weather", r#"{"city":"B"}"#)]);
    let model = ScriptedModel::repeating(two);
    let agent = agent_with(model, vec![weather_tool(weather.clone())], AgentConfig { max_steps: 5, ..Default::default() });
    let err = block_on(agent.run("?", RunOptions::default(), &mut CollectingSink::default())).unwrap_err();
    assert_eq!(err, AgentError::MaxStepsExceeded { max: 5, ran: 4, calls_not_run: 2 });
    assert_eq!(err.to_string(), "the run asked for more than 5 tool calls: 4 ran, and the 2 tool calls of its last answer were not run");
    assert_eq!(weather.calls.get(), 4, "the third pair would exceed the budget and is not executed");
}

#[test]
fn structured_returns_reprompt_until_the_answer_validates() {
    let schema = json!({ "type": "object", "properties": { "celsius": { "type": "number" } }, "required": ["celsius"] });
    let model = ScriptedModel::new(vec![text("It is warm."), text("```json\n{\"celsius\": 21}\n```")]);
    let agent = agent_with(model.clone(), vec![], AgentConfig { returns: Some(schema), ..Default::default() });
    let mut sink = CollectingSink::default();
    let out = block_on(agent.run("?", RunOptions::default(), &mut sink)).unwrap();
    assert_eq!(out.output, json!({ "celsius": 21 }));
    assert!(types(&sink).contains(&"output.retry"));
    let Message::System { content } = &model.requests.borrow()[0].messages[0] else { panic!() };
    assert!(content.contains("JSON Schema"));
}

#[test]
fn structured_returns_ask_for_the_schema_on_turns_without_tools_only() {
    let schema = json!({ "type": "object", "properties": { "celsius": { "type": "number" } }, "required": ["celsius"] });
    let asked = |tools: Vec<Tool>, returns: Value| {
        let model = ScriptedModel::repeating(text("{\"celsius\": 21}"));
        let agent = agent_with(model.clone(), tools, AgentConfig { returns: Some(returns), ..Default::default() });
        // (The array schema's run fails its check; only the request matters here.)
        let _ = block_on(agent.run("?", RunOptions::default(), &mut CollectingSink::default()));
        let format = model.requests.borrow()[0].response_format.clone();
        format
    };
    assert_eq!(asked(vec![], schema.clone()), Some(ResponseFormat::JsonSchema { name: "answer".into(), schema: std::rc::Rc::new(schema.clone()) }));
    // With tools the answer may be a call; a non-object root is not sent (checked only).
    assert_eq!(asked(vec![weather_tool(FnTool::new(|_| Ok(json!({}))))], schema), None);
    assert_eq!(asked(vec![], json!({ "type": "array" })), None);
    // A root naming a local definition (Zod's `.meta({ id })`): that object, its definitions kept.
    let person = json!({ "type": "object", "properties": { "name": { "type": "string" }, "pet": { "$ref": "#/$defs/Pet" } } });
    let pet = json!({ "type": "object", "properties": { "kind": { "type": "string" } } });
    let named = json!({ "$ref": "#/$defs/Person", "$defs": { "Person": person.clone(), "Pet": pet.clone() } });
    let mut sent = person.clone();
    sent["$defs"] = json!({ "Person": person, "Pet": pet });
    assert_eq!(asked(vec![], named), Some(ResponseFormat::JsonSchema { name: "answer".into(), schema: std::rc::Rc::new(sent) }));
    assert_eq!(asked(vec![], json!({ "$ref": "#/$defs/N", "$defs": { "N": { "type": "number" } } })), None, "a named non-object is not sent");
}

#[test]
fn structured_returns_give_up_after_the_bounded_retries() {
    let schema = json!({ "type": "object", "required": ["celsius"] });
    let model = ScriptedModel::repeating(text("{\"kelvin\": 3}"));
    let agent = agent_with(model.clone(), vec![], AgentConfig { returns: Some(schema), max_output_retries: 2, ..Default::default() });
    let err = block_on(agent.run("?", RunOptions::default(), &mut CollectingSink::default())).unwrap_err();
    assert!(matches!(err, AgentError::StructuredOutputInvalid { attempts: 3, .. }), "{err:?}");
    assert_eq!(model.requests.borrow().len(), 3);
}

#[test]
fn an_answer_cut_off_at_the_token_limit_is_not_taken_from_an_example_it_quoted_and_the_retry_says_why() {
    let schema = json!({ "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] });
    let cut_off = text_ending("Shape: {\"city\":\"Example\"}. Answer: {\"city\":\"Par", "length");
    let model = ScriptedModel::new(vec![cut_off.clone(), text("{\"city\":\"Paris\"}")]);
    let agent = agent_with(model.clone(), vec![], AgentConfig { returns: Some(schema.clone()), ..Default::default() });
    let out = block_on(agent.run("?", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    assert_eq!(out.output, json!({ "city": "Paris" }), "not the quoted example");
    let Some(Message::User { content }) = model.requests.borrow()[1].messages.last().cloned() else { panic!() };
    assert!(content.contains("cut off at the token limit"), "{content}");
    // Cut off every time: the error says so, rather than that no JSON value was found.
    let model = ScriptedModel::repeating(cut_off);
    let agent = agent_with(model, vec![], AgentConfig { returns: Some(schema.clone()), max_output_retries: 1, ..Default::default() });
    let err = block_on(agent.run("?", RunOptions::default(), &mut CollectingSink::default())).unwrap_err();
    assert!(matches!(&err, AgentError::StructuredOutputInvalid { attempts: 2, reason } if reason.contains("`length`")), "{err:?}");
    // A whole value cut off exactly at its end is an answer like any other.
    let model = ScriptedModel::new(vec![text_ending("{\"city\":\"Oslo\"}", "length")]);
    let agent = agent_with(model, vec![], AgentConfig { returns: Some(schema), ..Default::default() });
    assert_eq!(block_on(agent.run("?", RunOptions::default(), &mut CollectingSink::default())).unwrap().output, json!({ "city": "Oslo" }));
}

#[test]
fn a_filtered_answer_that_does_not_validate_is_not_asked_again() {
    let schema = json!({ "type": "object", "required": ["city"] });
    let model = ScriptedModel::repeating(text_ending("", "content_filter"));
    let agent = agent_with(model.clone(), vec![], AgentConfig { returns: Some(schema), max_output_retries: 2, ..Default::default() });
    let err = block_on(agent.run("?", RunOptions::default(), &mut CollectingSink::default())).unwrap_err();
    assert!(matches!(&err, AgentError::StructuredOutputInvalid { attempts: 1, reason } if reason.contains("`content_filter`")), "{err:?}");
    assert_eq!(model.requests.borrow().len(), 1, "a retry would be filtered again");
}

#[test]
fn an_invalid_answer_on_the_last_turn_is_structured_output_invalid_without_a_retry_announced() {
    let schema = json!({ "type": "object", "required": ["celsius"] });
    let model = ScriptedModel::repeating(text("{\"kelvin\": 3}"));
    let agent = agent_with(model.clone(), vec![], AgentConfig { returns: Some(schema), max_turns: 1, max_output_retries: 2, ..Default::default() });
    let mut sink = CollectingSink::default();
    let err = block_on(agent.run("?", RunOptions::default(), &mut sink)).unwrap_err();
    // Before: an `output.retry` event, then max_turns_exceeded, the schema's reason only in the event.
    assert!(matches!(&err, AgentError::StructuredOutputInvalid { attempts: 1, reason } if reason.contains("celsius")), "{err:?}");
    assert!(!types(&sink).contains(&"output.retry"), "no turn is left for a retry");
    assert_eq!(model.requests.borrow().len(), 1);
}

/// Refuses answers whose `n` is over 10, as a Standard Schema refinement would.
struct AtMostTen;

#[async_trait::async_trait(?Send)]
impl crucible::agent::OutputCheck for AtMostTen {
    async fn check(&self, value: &Value, _run_id: &str) -> Result<(), crucible::agent::OutputRefusal> {
        match value["n"].as_f64() {
            Some(n) if n > 10.0 => Err(crucible::agent::OutputRefusal::Refused("/n: at most 10".into())),
            Some(_) => Ok(()),
            None => Err(crucible::agent::OutputRefusal::Failed("the check broke".into())),
        }
    }
}

#[test]
fn a_host_check_of_the_answer_asks_again_like_a_schema_violation_and_keeps_refused_answers_out_of_the_output() {
    let schema = json!({ "type": "object", "properties": { "n": { "type": "number" } }, "required": ["n"] });
    let model = ScriptedModel::new(vec![text("{\"n\": 50}"), text("{\"n\": 5}")]);
    let agent = agent_with(model.clone(), vec![], AgentConfig { returns: Some(schema.clone()), ..Default::default() }).with_output_check(Rc::new(AtMostTen));
    let mut sink = CollectingSink::default();
    let out = block_on(agent.run("?", RunOptions { session_id: Some("s".into()), ..Default::default() }, &mut sink)).unwrap();
    assert_eq!(out.output, json!({ "n": 5 }));
    let retry = sink.events.iter().find_map(|e| match &e.body {
        EventBody::OutputRetry { reason, .. } => Some(reason.clone()),
        _ => None,
    });
    assert_eq!(retry.as_deref(), Some("/n: at most 10"));
    // The model heard why, and the check counts against the retries like a schema violation.
    let Message::User { content } = model.requests.borrow()[1].messages.last().unwrap().clone() else { panic!() };
    assert!(content.contains("/n: at most 10"), "{content}");
    let stubborn = ScriptedModel::repeating(text("{\"n\": 50}"));
    let agent =
        agent_with(stubborn, vec![], AgentConfig { returns: Some(schema), max_output_retries: 1, ..Default::default() }).with_output_check(Rc::new(AtMostTen));
    let err = block_on(agent.run("?", RunOptions::default(), &mut CollectingSink::default())).unwrap_err();
    assert!(matches!(err, AgentError::StructuredOutputInvalid { attempts: 2, .. }), "{err:?}");
    // A check that fails in itself ends the run at once: asking the model again cannot help.
    let model = ScriptedModel::repeating(text("{\"n\": \"five\"}"));
    let loose = json!({ "type": "object", "required": ["n"] });
    let agent = agent_with(model.clone(), vec![], AgentConfig { returns: Some(loose), ..Default::default() }).with_output_check(Rc::new(AtMostTen));
    let err = block_on(agent.run("?", RunOptions::default(), &mut CollectingSink::default())).unwrap_err();
    assert_eq!(err.code(), "output_check_failed");
    assert_eq!(model.requests.borrow().len(), 1);
}

/// An output check that never finishes, as an async refinement waiting on a dead service.
struct NeverDecides;

#[async_trait::async_trait(?Send)]
impl crucible::agent::OutputCheck for NeverDecides {
    async fn check(&self, _value: &Value, _run_id: &str) -> Result<(), crucible::agent::OutputRefusal> {
        futures::future::pending().await
    }
}

#[test]
fn an_abort_ends_a_run_while_the_host_checks_its_answer() {
    let schema = json!({ "type": "object" });
    let model = ScriptedModel::new(vec![text("{}")]);
    let agent = agent_with(model, vec![], AgentConfig { returns: Some(schema), ..Default::default() }).with_output_check(Rc::new(NeverDecides));
    let cancel = Rc::new(CancelFlag::default());
    let mut sink = CollectingSink::default();
    let run = agent.run("?", RunOptions { cancel: Some(cancel.clone()), ..Default::default() }, &mut sink);
    let abort = async {
        support::YieldOnce::default().await;
        cancel.cancel();
    };
    let (result, ()) = block_on(futures::future::join(run, abort));
    assert_eq!(result.unwrap_err(), AgentError::Aborted);
}

#[test]
fn parallel_calls_are_bounded_and_results_come_back_in_call_order() {
    // The first call is slowest, so completion order differs from call order.
    let tool = FnTool::with_delay(
        |args| Ok(json!({ "city": args["city"] })),
        |args| match args["city"].as_str() {
            Some("A") => 6,
            Some("B") => 1,
            _ => 3,
        },
    );
    let four = calls(&[
        ("get_weather", r#"{"city":"A"}"#),
        ("get_weather", r#"{"city":"B"}"#),
        ("get_weather", r#"{"city":"C"}"#),
        ("get_weather", r#"{"city":"D"}"#),
    ]);
    let model = ScriptedModel::new(vec![four, text("done")]);
    let agent = agent_with(model.clone(), vec![weather_tool(tool.clone())], AgentConfig { max_parallel_tools: 2, ..Default::default() });
    let mut sink = CollectingSink::default();
    block_on(agent.run("?", RunOptions::default(), &mut sink)).unwrap();
    assert_eq!(tool.max_in_flight.get(), 2, "at most maxParallelTools calls run at once, and they do overlap");
    assert_ne!(tool.finished_order.borrow()[0], "call_0", "the slow first call finishes later");
    let ends = ended_calls(&sink);
    assert_eq!(ends, ["call_0", "call_1", "call_2", "call_3"]);
    let request = &model.requests.borrow()[1];
    let ids: Vec<&str> = request
        .messages
        .iter()
        .filter_map(|m| match m {
            Message::Tool { tool_call_id, .. } => Some(tool_call_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(ids, ["call_0", "call_1", "call_2", "call_3"]);
}

#[test]
fn a_slow_call_does_not_hold_up_the_calls_after_it() {
    let tool = FnTool::with_delay(|args| Ok(json!({ "city": args["city"] })), |args| if args["city"] == "slow" { 40 } else { 1 });
    let list: Vec<(&str, &str)> =
        [r#"{"city":"slow"}"#, r#"{"city":"b"}"#, r#"{"city":"c"}"#, r#"{"city":"d"}"#, r#"{"city":"e"}"#].iter().map(|args| ("get_weather", *args)).collect();
    let model = ScriptedModel::new(vec![calls(&list), text("done")]);
    let agent = agent_with(model, vec![weather_tool(tool.clone())], AgentConfig { max_parallel_tools: 2, ..Default::default() });
    let mut sink = CollectingSink::default();
    block_on(agent.run("?", RunOptions::default(), &mut sink)).unwrap();
    assert_eq!(tool.max_in_flight.get(), 2);
    assert_eq!(
        tool.finished_order.borrow().last().map(String::as_str),
        Some("call_0"),
        "the fast calls ran beside the slow one: {:?}",
        tool.finished_order.borrow()
    );
    let ends = ended_calls(&sink);
    assert_eq!(ends, ["call_0", "call_1", "call_2", "call_3", "call_4"], "still reported in call order");
}

#[test]
fn usage_is_accounted_per_model() {
    let weather = FnTool::new(|_| Ok(json!({})));
    let model = ScriptedModel::new(vec![call("get_weather", r#"{"city":"Oslo"}"#), text("ok")]);
    let agent = agent_with(model, vec![weather_tool(weather)], AgentConfig::default());
    let out = block_on(agent.run("?", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    assert_eq!((out.usage.input_tokens, out.usage.output_tokens), (20, 10));
    assert_eq!(out.usage.by_model["scripted:test"].input_tokens, 20);
}

#[test]
fn a_cancelled_run_stops_before_the_next_turn() {
    let flag = Rc::new(CancelFlag::default());
    let f2 = flag.clone();
    let weather = FnTool::new(move |_| {
        f2.cancel();
        Ok(json!({}))
    });
    let model = ScriptedModel::new(vec![call("get_weather", r#"{"city":"Oslo"}"#), text("never")]);
    let agent = agent_with(model.clone(), vec![weather_tool(weather)], AgentConfig::default());
    let err = block_on(agent.run("?", RunOptions { cancel: Some(flag), ..Default::default() }, &mut CollectingSink::default())).unwrap_err();
    assert_eq!(err, AgentError::Aborted);
    assert_eq!(model.requests.borrow().len(), 1, "no model call after the abort");
}

#[test]
fn an_abort_during_the_model_answer_ends_the_run_whatever_the_provider_does() {
    for hangs in [false, true] {
        let flag = Rc::new(CancelFlag::default());
        let model = Rc::new(AbortedMidAnswer { flag: flag.clone(), then: if hangs { AfterAbort::Hang } else { AfterAbort::EndQuietly } });
        let agent = Agent::new(AgentConfig::default(), model, ToolSet::new(), Rc::new(NativeEnvironment::default())).unwrap();
        let options = RunOptions { cancel: Some(flag), session_id: Some("s".into()), ..Default::default() };
        let err = block_on(agent.run("?", options, &mut CollectingSink::default())).unwrap_err();
        assert_eq!(err, AgentError::Aborted, "hangs: {hangs}");
        assert!(agent.history("s").is_empty(), "an aborted run adds no partial answer to its session (hangs: {hangs})");
    }
}

/// A tool that never finishes and ignores cancellation (a host tool that drops its signal,
/// or forge tests running to a long sandbox deadline).
struct NeverFinishes;

#[async_trait::async_trait(?Send)]
impl crucible::tools::ToolHandler for NeverFinishes {
    async fn call(&self, _args: Value, _ctx: &crucible::tools::CallContext) -> Result<Value, ToolFailure> {
        futures::future::pending().await
    }
}

#[test]
fn a_cancel_abandons_tool_calls_still_running() {
    let flag = Rc::new(CancelFlag::default());
    let hang = Tool::new("hang", "Never returns", &json!({ "type": "object" }), None, Rc::new(NeverFinishes)).unwrap();
    let model = ScriptedModel::new(vec![call("hang", "{}"), text("never")]);
    let agent = Rc::new(agent_with(model.clone(), vec![hang], AgentConfig::default()));
    let outcome: Rc<std::cell::RefCell<Option<Result<(), AgentError>>>> = Rc::default();
    let mut pool = futures::executor::LocalPool::new();
    {
        let (agent, flag, outcome) = (agent.clone(), flag.clone(), outcome.clone());
        futures::task::LocalSpawnExt::spawn_local(&pool.spawner(), async move {
            let result = agent.run("?", RunOptions { cancel: Some(flag), ..Default::default() }, &mut CollectingSink::default()).await;
            *outcome.borrow_mut() = Some(result.map(|_| ()));
        })
        .unwrap();
    }
    pool.run_until_stalled();
    assert!(outcome.borrow().is_none(), "the run waits on the tool");
    flag.cancel();
    pool.run_until_stalled();
    assert_eq!(outcome.borrow().clone(), Some(Err(AgentError::Aborted)), "the cancel ends the run without the tool");
    assert_eq!(model.requests.borrow().len(), 1, "no model call after the abort");
}

#[test]
fn a_model_failure_ends_the_run_with_its_code() {
    let model = ScriptedModel::new(vec![Reply::Fail(ModelError { code: "provider_http".into(), message: "500".into(), status: Some(500) })]);
    let agent = agent_with(model, vec![], AgentConfig::default());
    let err = block_on(agent.run("?", RunOptions::default(), &mut CollectingSink::default())).unwrap_err();
    assert_eq!(err.code(), "provider_http");
}

#[test]
fn a_session_remembers_earlier_runs_and_failed_runs_leave_it_unchanged() {
    let model = ScriptedModel::new(vec![text("first answer"), Reply::Fail(ModelError::new("provider_http", "x")), text("second answer")]);
    let agent = agent_with(model.clone(), vec![], AgentConfig::default());
    block_on(agent.run("first", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    assert!(block_on(agent.run("broken", RunOptions::default(), &mut CollectingSink::default())).is_err());
    block_on(agent.run("second", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    let last = model.requests.borrow().last().unwrap().messages.clone();
    assert_eq!(
        last,
        vec![
            Message::User { content: "first".into() },
            Message::Assistant { content: "first answer".into(), tool_calls: vec![] },
            Message::User { content: "second".into() },
        ]
    );
    let other = block_on(agent.run("x", RunOptions { session_id: Some("s2".into()), ..Default::default() }, &mut CollectingSink::default()));
    assert!(other.is_err(), "script exhausted; s2 has its own empty history");
}

#[test]
fn events_serialize_with_a_type_tag_and_camel_case_fields() {
    let model = ScriptedModel::new(vec![call("get_weather", r#"{"city":"Oslo"}"#), text("ok")]);
    let agent = agent_with(model, vec![weather_tool(FnTool::new(|_| Ok(json!({"celsius": 1}))))], AgentConfig::default());
    let mut sink = CollectingSink::default();
    block_on(agent.run("?", RunOptions::default(), &mut sink)).unwrap();
    let end = sink.events.iter().find(|e| matches!(e.body, EventBody::ToolExecuteEnd { .. })).unwrap();
    let v = serde_json::to_value(end).unwrap();
    assert_eq!(v["type"], "tool.execute.end");
    assert_eq!(v["callId"], "call_0");
    assert!(v["runId"].is_string() && v["runPath"].is_array() && v["durationMs"].is_number());
}

#[test]
fn tool_choice_holds_until_the_first_tool_call_then_resets_to_auto() {
    use crucible::model::ToolChoice;
    let model = ScriptedModel::new(vec![call("get_weather", r#"{"city":"Oslo"}"#), text("7 degrees")]);
    let config = AgentConfig { tool_choice: Some(ToolChoice::Required), ..AgentConfig::default() };
    let agent = agent_with(model.clone(), vec![weather_tool(FnTool::new(|_| Ok(json!({ "celsius": 7 }))))], config);
    let out = block_on(agent.run("weather in Oslo?", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    assert_eq!(out.output, json!("7 degrees"));
    let choices: Vec<_> = model.requests.borrow().iter().map(|r| r.tool_choice.clone()).collect();
    assert_eq!(choices, vec![Some(ToolChoice::Required), None], "the second turn must be free to answer");
}

#[test]
fn tool_choice_without_reset_applies_to_every_turn_and_a_named_tool_must_be_offered() {
    use crucible::model::ToolChoice;
    let named = Some(ToolChoice::Tool("get_weather".into()));
    let model = ScriptedModel::new(vec![call("get_weather", r#"{"city":"Oslo"}"#), text("7 degrees")]);
    let config = AgentConfig { tool_choice: named.clone(), reset_tool_choice: false, ..AgentConfig::default() };
    let agent = agent_with(model.clone(), vec![weather_tool(FnTool::new(|_| Ok(json!({ "celsius": 7 }))))], config);
    block_on(agent.run("weather in Oslo?", RunOptions::default(), &mut CollectingSink::default())).unwrap();
    let choices: Vec<_> = model.requests.borrow().iter().map(|r| r.tool_choice.clone()).collect();
    assert_eq!(choices, vec![named.clone(), named]);

    // A tool the turn does not offer: a typed configuration error, and no model call.
    let model = ScriptedModel::new(vec![text("unused")]);
    let config = AgentConfig { tool_choice: Some(ToolChoice::Tool("forge_tool".into())), ..AgentConfig::default() };
    let agent = agent_with(model.clone(), vec![weather_tool(FnTool::new(|_| Ok(json!({}))))], config);
    let err = block_on(agent.run("hi", RunOptions::default(), &mut CollectingSink::default())).unwrap_err();
    assert_eq!(err.code(), "invalid_config");
    assert!(err.to_string().contains("forge_tool"), "{err}");
    assert!(model.requests.borrow().is_empty());

    // Without tools, a choice that asks for a call cannot be obeyed: a typed error before any
    // model call (before, it was dropped and the run answered as if none was set).
    for choice in [ToolChoice::Required, ToolChoice::Tool("get_weather".into())] {
        let model = ScriptedModel::new(vec![text("hello")]);
        let agent = agent_with(model.clone(), vec![], AgentConfig { tool_choice: Some(choice.clone()), ..AgentConfig::default() });
        let err = block_on(agent.run("hi", RunOptions::default(), &mut CollectingSink::default())).unwrap_err();
        assert_eq!(err.code(), "invalid_config", "{choice:?}");
        assert!(err.to_string().contains("has no tools"), "{err}");
        assert!(model.requests.borrow().is_empty());
    }
    // `auto` and `none` need no tool: no choice is sent.
    for choice in [ToolChoice::Auto, ToolChoice::None] {
        let model = ScriptedModel::new(vec![text("hello")]);
        let agent = agent_with(model.clone(), vec![], AgentConfig { tool_choice: Some(choice), ..AgentConfig::default() });
        block_on(agent.run("hi", RunOptions::default(), &mut CollectingSink::default())).unwrap();
        assert_eq!(model.requests.borrow()[0].tool_choice, None);
    }
}

#[test]
fn tool_choice_reads_from_the_ts_option_shapes() {
    use crucible::model::ToolChoice;
    let parse = |v: Value| serde_json::from_value::<AgentConfig>(json!({ "toolChoice": v })).map(|c| c.tool_choice);
    assert_eq!(parse(json!("required")).unwrap(), Some(ToolChoice::Required));
    assert_eq!(parse(json!("none")).unwrap(), Some(ToolChoice::None));
    assert_eq!(parse(json!({ "tool": "forge_tool" })).unwrap(), Some(ToolChoice::Tool("forge_tool".into())));
    assert!(parse(json!("always")).is_err());
    assert!(AgentConfig { tool_choice: Some(ToolChoice::Tool(String::new())), ..AgentConfig::default() }.validate().is_err());
}

#[test]
fn a_provider_failing_as_aborted_in_a_run_nobody_aborted_is_a_model_failure() {
    let model = ScriptedModel::new(vec![Reply::Fail(ModelError::new("aborted", "the provider's own timer fired"))]);
    let agent = agent_with(model, vec![], AgentConfig::default());
    let err = block_on(agent.run("?", RunOptions::default(), &mut CollectingSink::default())).unwrap_err();
    assert_eq!(err.code(), "provider_protocol", "{err}");
    assert!(err.to_string().contains("own timer fired"), "{err}");
}

#[test]
fn settings_every_provider_refuses_are_invalid_config() {
    let with = |config: AgentConfig| config.validate();
    assert!(with(AgentConfig { temperature: Some(f64::NAN), ..AgentConfig::default() }).is_err());
    assert!(with(AgentConfig { temperature: Some(-0.5), ..AgentConfig::default() }).is_err());
    assert!(with(AgentConfig { max_tokens: Some(0), ..AgentConfig::default() }).is_err());
    assert!(with(AgentConfig { temperature: Some(0.0), max_tokens: Some(1), ..AgentConfig::default() }).is_ok());
}

#[test]
fn an_answer_that_says_it_ended_for_tool_calls_but_has_none_completes_as_other() {
    // `tool_calls` is the paused run's reason; a completed one never says it.
    for provider_said in ["tool_calls", "tool_use", "function_call"] {
        let model = ScriptedModel::new(vec![text_ending("No call after all.", provider_said)]);
        let agent = agent_with(model, vec![], AgentConfig::default());
        let mut sink = CollectingSink::default();
        let out = block_on(agent.run("?", RunOptions::default(), &mut sink)).unwrap();
        assert_eq!((out.status, out.finish_reason.as_str(), out.text.as_str()), (RunStatus::Completed, "other", "No call after all."), "{provider_said}");
        assert!(matches!(&sink.events.last().unwrap().body, EventBody::AgentEnd { finish_reason, .. } if finish_reason == "other"));
        // The step keeps the provider's own word.
        assert!(sink.events.iter().any(|e| matches!(&e.body, EventBody::StepEnd { finish_reason, .. } if finish_reason == provider_said)));
    }
}

#[test]
fn the_result_says_why_the_answer_ended_in_one_vocabulary() {
    for (provider_said, expected) in
        [("stop", "stop"), ("end_turn", "stop"), ("length", "length"), ("max_tokens", "length"), ("content_filter", "content_filter"), ("weird", "other")]
    {
        let model = ScriptedModel::new(vec![text_ending("an answer cut mid-sen", provider_said)]);
        let agent = agent_with(model, vec![], AgentConfig::default());
        let mut sink = CollectingSink::default();
        let out = block_on(agent.run("?", RunOptions::default(), &mut sink)).unwrap();
        assert_eq!(out.finish_reason, expected, "{provider_said}");
        assert!(matches!(&sink.events.last().unwrap().body, EventBody::AgentEnd { finish_reason, .. } if finish_reason == expected));
    }
}

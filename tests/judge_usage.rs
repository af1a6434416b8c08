//! The forge judge's tokens are the app's spend like the agent's own: a run whose model forges
//! counts them in its usage (under the judge's model id), `forge.judge` carries them, and a
//! direct forge or a promotion reports what its judge calls spent.

mod support;

use std::rc::Rc;

use crucible::agent::{Agent, AgentConfig, CollectingSink, EventBody, NativeEnvironment, RunOptions, ToolProvider};
use crucible::model::Usage;
use crucible::registry::{EmergentConfig, PromotionStatus, PromotionThreshold, Tier};
use crucible::store::MemoryStore;
use futures::executor::block_on;
use serde_json::json;
use support::emergent::*;
use support::{call, text, Reply, ScriptedModel};

const JUDGE_ID: &str = "anthropic:judge";
const JUDGE_USAGE: Usage = Usage { input_tokens: 1200, output_tokens: 150 };

/// A judge on another provider than the agent's model, answering `replies`.
fn billed_judge(replies: Vec<Reply>) -> Rc<ScriptedModel> {
    ScriptedModel::identified(replies, JUDGE_ID, JUDGE_USAGE)
}

fn rig_judged_by(judge: Rc<ScriptedModel>) -> Rig {
    rig_with(EmergentConfig::default(), Some(judge), None, Rc::new(MemoryStore::new()))
}

fn judge_events(r: &Rig) -> Vec<Usage> {
    r.events
        .bodies()
        .into_iter()
        .filter_map(|b| match b {
            EventBody::ForgeJudge { usage, .. } => Some(usage),
            _ => None,
        })
        .collect()
}

/// Runs a model that forges `slugify` with one `forge_tool` call, then answers.
fn run_forging(r: &Rig) -> (crucible::agent::RunOutput, Vec<crucible::agent::AgentEvent>) {
    let model = ScriptedModel::new(vec![call("forge_tool", &slugify_request("slugify", SLUGIFY_JS).to_string()), text("done")]);
    let agent = Agent::new(AgentConfig::default(), model, host_tools(), Rc::new(NativeEnvironment::default())).unwrap();
    agent.set_tool_provider(Some(r.registry.clone() as Rc<dyn ToolProvider>));
    let mut sink = CollectingSink::default();
    let out = block_on(agent.run("forge a slugify tool", RunOptions { session_id: Some("s1".into()), ..Default::default() }, &mut sink)).unwrap();
    (out, sink.events)
}

#[test]
fn a_run_whose_model_forges_counts_the_judges_tokens_under_the_judges_model() {
    let r = rig_judged_by(billed_judge(vec![text(&verdict(true, 0.9, 0.9))]));
    let (out, events) = run_forging(&r);
    assert_eq!(out.text, "done");
    assert_eq!(out.usage.by_model.get(JUDGE_ID), Some(&JUDGE_USAGE), "{:?}", out.usage);
    // The agent's own model: two answers of 10 + 5 tokens each.
    assert_eq!(out.usage.by_model.get("scripted:test"), Some(&Usage { input_tokens: 20, output_tokens: 10 }));
    assert_eq!((out.usage.input_tokens, out.usage.output_tokens), (1220, 160));
    let ended = events.iter().find_map(|e| match &e.body {
        EventBody::AgentEnd { usage, .. } => Some(usage.clone()),
        _ => None,
    });
    assert_eq!(ended, Some(out.usage), "agent.end reports the same usage");
    assert_eq!(judge_events(&r), vec![JUDGE_USAGE], "forge.judge carries its call's tokens");
}

#[test]
fn a_run_counts_a_judge_call_that_gave_no_verdict_too() {
    // Cut off at its token limit: the call was paid for, and the forge is rejected.
    let r = rig_judged_by(billed_judge(vec![support::text_ending("{\"approved\": tr", "length")]));
    let (out, _) = run_forging(&r);
    assert_eq!(out.usage.by_model.get(JUDGE_ID), Some(&JUDGE_USAGE), "{:?}", out.usage);
    assert!(judge_events(&r).is_empty(), "no verdict, no forge.judge");
    assert!(r.registry.list("s1").is_empty());
}

#[test]
fn a_direct_forge_reports_its_judges_tokens_whenever_the_judge_was_asked() {
    let r = rig_judged_by(billed_judge(vec![text(&verdict(true, 0.9, 0.9)), text(&verdict(false, 0.2, 0.9))]));
    let approved = block_on(r.registry.forge(&slugify_request("slugify", SLUGIFY_JS), "s1"));
    assert!(approved.success, "{approved:?}");
    assert_eq!(approved.usage, Some(JUDGE_USAGE));
    assert_eq!(serde_json::to_value(&approved).unwrap()["usage"], json!({ "inputTokens": 1200, "outputTokens": 150 }));

    let again = block_on(r.registry.forge(&slugify_request("slugify", SLUGIFY_JS), "s1"));
    assert!(again.unchanged && again.usage.is_none(), "an unchanged request asks no judge: {again:?}");

    let refused = block_on(r.registry.forge(&slugify_request("slug_two", SLUGIFY_V2_JS), "s1"));
    assert!(!refused.success && refused.verdict.is_some(), "{refused:?}");
    assert_eq!(refused.usage, Some(JUDGE_USAGE), "a rejecting verdict was paid for as well");

    let mut malformed = slugify_request("slug_three", SLUGIFY_JS);
    malformed["testCases"] = json!([]);
    let unjudged = block_on(r.registry.forge(&malformed, "s1"));
    assert!(!unjudged.success && unjudged.usage.is_none(), "rejected before review: {unjudged:?}");
    assert!(serde_json::to_value(&unjudged).unwrap().get("usage").is_none());
}

#[test]
fn a_promotion_reports_what_its_two_reviewers_spent_together() {
    let panel = ScriptedModel::identified(vec![text(&verdict(true, 0.9, 0.9)), text(&verdict(true, 0.9, 0.9))], "panel:model", JUDGE_USAGE);
    let config = EmergentConfig { promotion_threshold: PromotionThreshold { uses: 1, confidence: 0.8 }, auto_promote: false, ..Default::default() };
    let r = rig_with(config, Some(approving_judge()), Some(panel), Rc::new(MemoryStore::new()));
    assert!(block_on(r.registry.forge(&slugify_request("slugify", SLUGIFY_JS), "s1")).success);
    block_on(r.registry.call("slugify", json!({ "text": "A b" }), "s1")).unwrap();
    let out = block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap();
    assert_eq!(out.status, PromotionStatus::Promoted, "{out:?}");
    assert_eq!(out.usage, Some(Usage { input_tokens: 2400, output_tokens: 300 }));
}

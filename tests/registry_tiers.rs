//! The tiered registry (issue 4 scope items 7 and 9): limits, persistence, promotion,
//! approvals, demotion, rollback, audit, export/import — over the in-memory store double.

mod support;

use std::future::Future as _;
use std::rc::Rc;

use crucible::agent::EventBody;
use crucible::forge::RejectionCategory;
use crucible::registry::{
    EmergentConfig, ImportOptions, PromotionStatus, PromotionThreshold, RegistryError, Tier, ToolStatus, MAX_EXPANDED_BYTES, MAX_FLOW_NESTING,
    MAX_PACKAGE_BYTES,
};
use crucible::store::{BatchOp, MemoryStore, Store};
use futures::executor::block_on;
use serde_json::json;
use support::emergent::*;
use support::text;

fn forge_ok(r: &Rig, name: &str, code: &str, session: &str) {
    let res = block_on(r.registry.forge(&slugify_request(name, code), session));
    assert!(res.success, "{res:?}");
}

fn use_n(r: &Rig, name: &str, n: usize, session: &str) {
    for _ in 0..n {
        block_on(r.registry.call(name, json!({ "text": "A b" }), session)).unwrap();
    }
}

fn promo_config() -> EmergentConfig {
    // Explicit requests only: these tests drive each promotion step themselves.
    EmergentConfig { promotion_threshold: PromotionThreshold { uses: 3, confidence: 0.8 }, promotion_retry_uses: 2, auto_promote: false, ..Default::default() }
}

#[test]
fn a_session_tool_promotes_itself_after_n_successful_uses_and_a_no_is_not_re_asked_soon() {
    let config = EmergentConfig { auto_promote: true, ..promo_config() };
    let panel =
        judge_replying(vec![text(&verdict(true, 0.9, 0.9)), text(&verdict(false, 0.3, 0.9)), text(&verdict(true, 0.9, 0.9)), text(&verdict(true, 0.9, 0.9))]);
    let r = rig_with(config, Some(approving_judge()), Some(panel.clone()), Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 2, "s1");
    assert_eq!(panel.requests.borrow().len(), 0, "below the threshold nobody is asked");
    use_n(&r, "slugify", 1, "s1");
    assert_eq!(panel.requests.borrow().len(), 2, "the third use asks the two-reviewer panel, which says no");
    use_n(&r, "slugify", 1, "s1");
    assert_eq!(panel.requests.borrow().len(), 2, "a rejected promotion is not re-asked before M more uses");
    use_n(&r, "slugify", 1, "s1");
    assert_eq!(panel.requests.borrow().len(), 4, "after M = 2 more uses it is asked again and approves");
    let tiers: Vec<_> = r.registry.list("s1").into_iter().map(|t| (t.name, t.tier)).collect();
    assert_eq!(tiers, vec![("slugify".to_string(), Tier::Agent)]);
    assert!(r.events.0.borrow().iter().any(|e| matches!(&e.body, crucible::agent::EventBody::ToolPromoted { .. })));
}

/// A rig whose session tool `slugify` is ready for promotion to the agent tier.
fn promoted_rig(store: Rc<MemoryStore>) -> Rig {
    let r = rig_with(promo_config(), Some(approving_judge()), Some(approving_judge()), store);
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    let out = block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap();
    assert_eq!(out.status, PromotionStatus::Promoted, "{out:?}");
    r
}

/// A rig whose `slugify` went on, with a human's approval, to the shared tier.
fn shared_rig(store: Rc<MemoryStore>) -> Rig {
    let r = promoted_rig(store);
    let approval = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    block_on(r.registry.approve(&approval.id)).unwrap();
    r
}

#[test]
fn session_tools_are_limited_per_session_and_discarded_at_session_end() {
    let r = rig_with(EmergentConfig { max_session_tools: 2, ..Default::default() }, Some(approving_judge()), None, Rc::new(MemoryStore::new()));
    forge_ok(&r, "t1", SLUGIFY_JS, "s1");
    forge_ok(&r, "t2", SLUGIFY_JS, "s1");
    forge_ok(&r, "t2", SLUGIFY_V2_JS, "s1"); // a new version of an existing tool does not count
    let res = block_on(r.registry.forge(&slugify_request("t3", SLUGIFY_JS), "s1"));
    assert!(!res.success && res.reason.unwrap().contains("maxSessionTools"));
    // A malformed request is told what is wrong with it, full session or not.
    let mut one_case = slugify_request("t4", SLUGIFY_JS);
    one_case["testCases"].as_array_mut().unwrap().truncate(1);
    assert_eq!(block_on(r.registry.forge(&one_case, "s1")).category, Some(RejectionCategory::ShapeCheck));
    forge_ok(&r, "t3", SLUGIFY_JS, "s2"); // other sessions have their own budget
    assert_eq!(r.registry.list("s1").len(), 2);
    assert!(r.registry.list("s1").iter().all(|t| t.tier == Tier::Session));
    block_on(r.registry.end_session("s1")).unwrap();
    assert!(r.registry.list("s1").is_empty());
    assert_eq!(block_on(r.registry.call("t1", json!({ "text": "x" }), "s1")).unwrap_err().code, "unknown_tool");
    assert_eq!(r.registry.list("s2").len(), 1);
}

#[test]
fn calls_update_per_tool_stats() {
    let r = rig();
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    // Invalid arguments are refused before the tool runs and are not counted as its calls.
    assert_eq!(block_on(r.registry.call("slugify", json!({ "nope": 1 }), "s1")).unwrap_err().code, "invalid_arguments");
    let info = r.registry.list("s1").into_iter().find(|t| t.name == "slugify").unwrap();
    assert_eq!((info.stats.calls, info.stats.successes, info.stats.failures), (3, 3, 0));
    assert!(info.stats.avg_latency_ms >= 0.0);
    assert_eq!(info.hash.len(), 64);

    // A compose tool whose reference does not resolve for some input fails at run time.
    let req = json!({
        "name": "prefixed", "description": "prefix then count",
        "inputSchema": { "type": "object", "properties": { "text": { "type": "string" }, "meta": { "type": "object" } }, "required": ["text"] },
        "outputSchema": { "type": "object", "properties": { "count": { "type": "integer" } } },
        "implementation": { "mode": "compose", "steps": [{ "name": "c", "tool": "word_count", "inputMapping": { "text": "$input.meta.p $input.text" } }] },
        "testCases": [{ "input": { "text": "a", "meta": { "p": "x" } }, "expectedOutput": { "count": 2 } }, { "input": { "text": "a b", "meta": { "p": "x" } }, "expectedOutput": { "count": 3 } }]
    });
    assert!(block_on(r.registry.forge(&req, "s1")).success);
    block_on(r.registry.call("prefixed", json!({ "text": "a", "meta": { "p": "y" } }), "s1")).unwrap();
    let err = block_on(r.registry.call("prefixed", json!({ "text": "a" }), "s1")).unwrap_err();
    assert!(err.message.contains("does not resolve"), "{err:?}");
    let info = r.registry.list("s1").into_iter().find(|t| t.name == "prefixed").unwrap();
    assert_eq!((info.stats.calls, info.stats.successes, info.stats.failures), (2, 1, 1));
    assert!((info.stats.success_rate - 0.5).abs() < 1e-9);
}

#[test]
fn promotion_to_agent_persists_across_a_fresh_load() {
    let store = Rc::new(MemoryStore::new());
    let r = promoted_rig(store.clone());
    assert!(r.events.types().contains(&"tool.promoted".to_string()));
    block_on(r.registry.end_session("s1")).unwrap();
    assert!(block_on(store.get("agent/agent1/tool/slugify")).unwrap().is_some());

    let fresh = rig_with(promo_config(), Some(approving_judge()), None, store.clone());
    let tools = fresh.registry.list("other-session");
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0].tier, Tier::Agent);
    assert_eq!(tools[0].stats.successes, 3, "stats survive");
    assert_eq!(block_on(fresh.registry.call("slugify", json!({ "text": "Hi There" }), "x")).unwrap(), json!({ "slug": "hi-there" }));
    assert!(fresh.registry.audit_trail().iter().any(|a| a.action == "promote"), "the audit trail is persisted");
}

#[test]
fn agent_stats_are_batch_written() {
    let store = Rc::new(MemoryStore::new());
    let config = EmergentConfig { stats_flush_every: 4, ..promo_config() };
    let r = rig_with(config, Some(approving_judge()), Some(approving_judge()), store.clone());
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
    let persisted_calls = || block_on(store.get("agent/agent1/stats/slugify")).unwrap().unwrap()["data"]["calls"].as_u64().unwrap();
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(persisted_calls(), 3, "not written yet");
    use_n(&r, "slugify", 1, "s1");
    assert_eq!(persisted_calls(), 7, "the 4th call flushes");
}

#[test]
fn agent_tier_calls_whose_flush_failed_are_written_by_the_next_flush() {
    for with_shared_calls in [false, true] {
        let memory = store_with_shared_slugify();
        let store = Rc::new(SharedDataStore::new(memory.clone()));
        let config = EmergentConfig { stats_flush_every: 1000, ..promo_config() };
        let r = rig_over("agent_f", config.clone(), Some(approving_judge()), Some(approving_judge()), memory.clone(), store.clone());
        forge_ok(&r, "tidy", SLUGIFY_JS, "s1");
        use_n(&r, "tidy", 3, "s1");
        assert_eq!(block_on(r.registry.request_promotion("tidy", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
        use_n(&r, "tidy", 2, "s1");
        if with_shared_calls {
            use_n(&r, "slugify", 1, "s1");
        }
        store.refuse_writes.set(true);
        assert_eq!(block_on(r.registry.flush_stats()).unwrap_err().code(), "store_quota");
        store.refuse_writes.set(false);
        block_on(r.registry.flush_stats()).unwrap();
        let reopened = rig_for("agent_f", config, Some(approving_judge()), None, memory.clone());
        let tidy = reopened.registry.list("s2").into_iter().find(|t| t.name == "tidy").unwrap();
        assert_eq!(tidy.stats.calls, 3 + 2, "the calls the failed flush took are written by the next (with shared calls: {with_shared_calls})");
        assert_eq!(stored_shared_calls(&memory), 3 + u64::from(with_shared_calls));
    }
}

#[test]
fn promotion_needs_uses_and_confidence_above_the_threshold() {
    let r = rig_with(promo_config(), Some(approving_judge()), Some(approving_judge()), Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 2, "s1");
    let out = block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap();
    assert_eq!(out.status, PromotionStatus::Rejected);
    assert!(out.reason.contains("3 successful uses"));

    // Above the threshold (0.8), as the spec says: equal is not enough.
    for confidence in [0.5, 0.8] {
        let r = rig_with(promo_config(), Some(ScriptedModelExt::judge(confidence)), Some(approving_judge()), Rc::new(MemoryStore::new()));
        forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
        use_n(&r, "slugify", 5, "s1");
        let out = block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap();
        assert_eq!(out.status, PromotionStatus::Rejected, "confidence {confidence}");
        assert!(out.reason.contains("not above the threshold"), "{}", out.reason);
    }
}

#[test]
fn a_version_forged_while_the_panel_reviews_the_previous_one_is_not_promoted_with_its_verdicts() {
    let r = rig_with(promo_config(), Some(approving_judge()), Some(approving_judge()), Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    // The panel's answers stream in pieces; the re-forge registers version 2 meanwhile.
    let newer = slugify_request("slugify", &format!("{SLUGIFY_JS} // v2"));
    let (promoted, reforged) = block_on(futures::future::join(r.registry.request_promotion("slugify", Tier::Agent, "s1"), r.registry.forge(&newer, "s1")));
    assert!(reforged.success, "{reforged:?}");
    let promoted = promoted.unwrap();
    assert_eq!(promoted.status, PromotionStatus::Rejected, "{promoted:?}");
    assert!(promoted.reason.contains("the tool changed while the panel reviewed it"), "{}", promoted.reason);
    assert!(r.events.types().contains(&"promotion.rejected".to_string()), "{:?}", r.events.types());
    let tools = r.registry.list("s1");
    assert_eq!(tools.iter().map(|t| (t.tier, t.version)).collect::<Vec<_>>(), [(Tier::Session, 2)], "version 2 stays in the session, unreviewed by the panel");
}

#[test]
fn a_demotion_made_while_the_panel_reviews_the_same_content_from_another_session_stands() {
    let r = rig_with(promo_config(), Some(approving_judge()), Some(approving_judge()), Rc::new(MemoryStore::new()));
    // The same content forged in two sessions; the first copy goes up to the agent tier, and
    // the second's review runs while the operator demotes it.
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    forge_ok(&r, "slugify", SLUGIFY_JS, "s2");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
    use_n(&r, "slugify", 3, "s2");
    let (promoted, demoted) = block_on(futures::future::join(r.registry.request_promotion("slugify", Tier::Agent, "s2"), r.registry.demote("slugify", "s1")));
    demoted.unwrap();
    let promoted = promoted.unwrap();
    // Before: promoted back to the agent tier as version 2, callable by every session.
    assert_eq!(promoted.status, PromotionStatus::Rejected, "{promoted:?}");
    assert!(promoted.reason.contains("the tool changed while the panel reviewed it"), "{}", promoted.reason);
    let above: Vec<_> = r.registry.list("s3").into_iter().map(|t| (t.tier, t.version, t.status)).collect();
    assert_eq!(above, [(Tier::Agent, 1, ToolStatus::Demoted)], "the agent tier keeps its tombstone");
}

struct ScriptedModelExt;
impl ScriptedModelExt {
    fn judge(confidence: f64) -> Rc<support::ScriptedModel> {
        support::ScriptedModel::repeating(text(&verdict(true, 0.9, confidence)))
    }
}

#[test]
fn the_panel_has_two_reviewers_who_must_both_approve_and_a_no_is_not_re_asked_soon() {
    let panel =
        judge_replying(vec![text(&verdict(true, 0.9, 0.9)), text(&verdict(false, 0.3, 0.9)), text(&verdict(true, 0.9, 0.9)), text(&verdict(true, 0.9, 0.9))]);
    let r = rig_with(promo_config(), Some(approving_judge()), Some(panel.clone()), Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    let n_sandbox = r.sandbox.requests.borrow().len();
    let out = block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap();
    assert_eq!(out.status, PromotionStatus::Rejected);
    assert!(out.reason.contains("correctness reviewer"), "{}", out.reason);
    let rejected: Vec<EventBody> = r.events.bodies().into_iter().filter(|b| matches!(b, EventBody::PromotionRejected { .. })).collect();
    assert_eq!(
        rejected,
        [EventBody::PromotionRejected { name: "slugify".into(), from_tier: Tier::Session, to_tier: Tier::Agent, reason: out.reason.clone() }],
        "the refusal is an event, not only the caller's return value (automatic promotions have no caller)"
    );
    assert_eq!(r.sandbox.requests.borrow().len(), n_sandbox + 2, "the tests are re-run first");
    {
        let asks = panel.requests.borrow();
        assert_eq!(asks.len(), 2, "two judge calls");
        let prompt = |i: usize| match &asks[i].messages[1] {
            crucible::model::Message::User { content } => content.clone(),
            _ => panic!(),
        };
        assert!(prompt(0).contains("SAFETY reviewer") && prompt(1).contains("CORRECTNESS reviewer"));
    }
    // Re-asking right away is suppressed without judge calls.
    let out = block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap();
    assert_eq!(out.status, PromotionStatus::Suppressed);
    assert_eq!(panel.requests.borrow().len(), 2);
    // M (= 2) more successful uses lift the suppression.
    use_n(&r, "slugify", 2, "s1");
    let out = block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap();
    assert_eq!(out.status, PromotionStatus::Promoted, "{out:?}");
    assert_eq!(panel.requests.borrow().len(), 4);
}

#[test]
fn a_panel_approval_not_above_the_confidence_threshold_counts_as_a_rejection() {
    // promotionThreshold.confidence is 0.8: an approval at or below it is no approval, as a
    // creation verdict at or below it does not let the tool be promoted.
    for (safety, correctness, who) in [(0.05, 0.05, "safety"), (0.9, 0.8, "correctness"), (0.8, 0.95, "safety")] {
        let panel = judge_replying(vec![text(&verdict(true, 0.9, safety)), text(&verdict(true, 0.9, correctness))]);
        let r = rig_with(promo_config(), Some(approving_judge()), Some(panel), Rc::new(MemoryStore::new()));
        forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
        use_n(&r, "slugify", 3, "s1");
        let out = block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap();
        assert_eq!(out.status, PromotionStatus::Rejected, "{safety}/{correctness}: {out:?}");
        assert!(out.reason.contains(&format!("the {who} reviewer approved with confidence")), "{}", out.reason);
        assert!(out.reason.contains("not above promotionThreshold.confidence 0.8"), "{}", out.reason);
        assert_eq!(out.verdicts.len(), 2, "both verdicts are kept with the refusal");
        assert_eq!(r.registry.list("s1")[0].tier, Tier::Session);
        // Remembered as a rejection: not re-asked before more uses.
        let again = block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap();
        assert_eq!(again.status, PromotionStatus::Suppressed);
    }
    // Just above it, both approve.
    let panel = judge_replying(vec![text(&verdict(true, 0.9, 0.81)), text(&verdict(true, 0.9, 0.81))]);
    let r = rig_with(promo_config(), Some(approving_judge()), Some(panel), Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
}

#[test]
fn a_changed_tool_may_be_re_asked_immediately() {
    let panel =
        judge_replying(vec![text(&verdict(false, 0.9, 0.9)), text(&verdict(true, 0.9, 0.9)), text(&verdict(true, 0.9, 0.9)), text(&verdict(true, 0.9, 0.9))]);
    let r = rig_with(promo_config(), Some(approving_judge()), Some(panel), Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Rejected);
    forge_ok(&r, "slugify", SLUGIFY_V2_JS, "s1"); // a new version: new hash, fresh stats
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
}

#[test]
fn a_rollback_to_a_version_the_panel_rejected_waits_for_its_remaining_uses_before_asking_again() {
    let panel = judge_replying(vec![text(&verdict(false, 0.3, 0.9)); 12]);
    let config = EmergentConfig { promotion_retry_uses: 5, ..promo_config() };
    let r = rig_with(config, Some(approving_judge()), Some(panel.clone()), Rc::new(MemoryStore::new()));
    let request = |r: &Rig| block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap();
    for code in [SLUGIFY_JS, SLUGIFY_V2_JS] {
        forge_ok(&r, "slugify", code, "s1");
        use_n(&r, "slugify", 3, "s1");
        assert_eq!(request(&r).status, PromotionStatus::Rejected);
    }
    assert_eq!(panel.requests.borrow().len(), 4, "versions 1 and 2 were each rejected");
    // Back to version 1, with the threshold's 3 uses: 2 of its 5 more uses are still missing.
    block_on(r.registry.rollback("slugify", 1, "s1")).unwrap();
    use_n(&r, "slugify", 3, "s1");
    let out = request(&r);
    assert_eq!(out.status, PromotionStatus::Suppressed, "{out:?}");
    assert!(out.reason.contains("2 more successful uses"), "{}", out.reason);
    // Version 2, rolled back to in turn, is not asked about again either.
    block_on(r.registry.rollback("slugify", 2, "s1")).unwrap();
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(request(&r).status, PromotionStatus::Suppressed);
    assert_eq!(panel.requests.borrow().len(), 4, "the panel is not asked about a version it rejected");
    use_n(&r, "slugify", 2, "s1");
    assert_eq!(request(&r).status, PromotionStatus::Rejected, "asked again once its 5 more uses passed");
    assert_eq!(panel.requests.borrow().len(), 6);
}

#[test]
fn a_rejected_version_stays_held_off_after_another_version_was_promoted_demoted_and_rolled_back_from() {
    let (no, yes) = (text(&verdict(false, 0.3, 0.9)), text(&verdict(true, 0.9, 0.9)));
    let panel = judge_replying(vec![no.clone(), no.clone(), yes.clone(), yes, no.clone(), no]);
    let config = EmergentConfig { promotion_retry_uses: 5, ..promo_config() };
    let r = rig_with(config, Some(approving_judge()), Some(panel.clone()), Rc::new(MemoryStore::new()));
    let request = |r: &Rig| block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap();
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(request(&r).status, PromotionStatus::Rejected, "version 1 is rejected");
    forge_ok(&r, "slugify", SLUGIFY_V2_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(request(&r).status, PromotionStatus::Promoted, "version 2 is promoted");
    assert_eq!(block_on(r.registry.demote("slugify", "s1")).unwrap().tier, Tier::Session);
    block_on(r.registry.rollback("slugify", 1, "s1")).unwrap();
    // Version 1 was rejected after 3 uses: it needs 5 more, and 3 have passed since.
    use_n(&r, "slugify", 3, "s1");
    let out = request(&r);
    assert_eq!(out.status, PromotionStatus::Suppressed, "{out:?}");
    assert!(out.reason.contains("2 more successful uses"), "{}", out.reason);
    assert_eq!(panel.requests.borrow().len(), 4, "the panel is not asked about version 1 again");
}

#[test]
fn a_rejected_version_stays_held_off_in_a_session_that_forges_over_the_promoted_tool_and_rolls_back_to_it() {
    let (no, yes) = (text(&verdict(false, 0.3, 0.9)), text(&verdict(true, 0.9, 0.9)));
    let panel = judge_replying(vec![no.clone(), no.clone(), yes.clone(), yes, no.clone(), no]);
    let config = EmergentConfig { promotion_retry_uses: 5, ..promo_config() };
    let r = rig_with(config, Some(approving_judge()), Some(panel.clone()), Rc::new(MemoryStore::new()));
    let request = |r: &Rig, session: &str| block_on(r.registry.request_promotion("slugify", Tier::Agent, session)).unwrap();
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(request(&r, "s1").status, PromotionStatus::Rejected, "version 1 is rejected");
    forge_ok(&r, "slugify", SLUGIFY_V2_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(request(&r, "s1").status, PromotionStatus::Promoted, "version 2 is promoted");
    // Another session forges version 3 over the agent tier's version 2, then rolls back to 1.
    forge_ok(&r, "slugify", &format!("{SLUGIFY_JS}\n// another take"), "s2");
    block_on(r.registry.rollback("slugify", 1, "s2")).unwrap();
    use_n(&r, "slugify", 3, "s2");
    let out = request(&r, "s2");
    assert_eq!(out.status, PromotionStatus::Suppressed, "{out:?}");
    assert!(out.reason.contains("2 more successful uses"), "{}", out.reason);
    assert_eq!(panel.requests.borrow().len(), 4, "the panel is not asked about version 1 again");
}

#[test]
fn the_agent_tier_is_limited() {
    let config = EmergentConfig { max_agent_tools: 1, ..promo_config() };
    let r = rig_with(config, Some(approving_judge()), Some(approving_judge()), Rc::new(MemoryStore::new()));
    for name in ["a", "b"] {
        forge_ok(&r, name, SLUGIFY_JS, "s1");
        use_n(&r, name, 3, "s1");
    }
    assert_eq!(block_on(r.registry.request_promotion("a", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
    let out = block_on(r.registry.request_promotion("b", Tier::Agent, "s1")).unwrap();
    assert_eq!(out.status, PromotionStatus::Rejected);
    assert!(out.reason.contains("maxAgentTools"));
    // A demoted tool's tombstone stays in the agent tier but takes no room there.
    assert_eq!(block_on(r.registry.demote("a", "s1")).unwrap().tier, Tier::Session);
    assert_eq!(block_on(r.registry.request_promotion("b", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
}

#[test]
fn shared_promotion_waits_for_approval_which_survives_a_restart() {
    let store = Rc::new(MemoryStore::new());
    let r = promoted_rig(store.clone());
    let out = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap();
    assert_eq!(out.status, PromotionStatus::Pending);
    let approval = out.approval.unwrap();
    assert!(r.events.types().contains(&"approval.requested".to_string()));
    assert_eq!(r.registry.list("s1")[0].tier, Tier::Agent, "nothing moves before approval");

    let fresh = rig_with(promo_config(), Some(approving_judge()), None, store.clone());
    assert_eq!(fresh.registry.pending_approvals(), vec![approval.clone()]);
    let info = block_on(fresh.registry.approve(&approval.id)).unwrap();
    assert_eq!(info.tier, Tier::Shared);
    assert!(fresh.registry.pending_approvals().is_empty());
    assert!(block_on(store.get("shared/tool/slugify")).unwrap().is_some());
    assert!(block_on(store.get("agent/agent1/tool/slugify")).unwrap().is_none());
    assert!(fresh.events.types().contains(&"tool.promoted".to_string()));
    // Another agent of the runtime sees the shared tool.
    let deps_other = rig_with(promo_config(), Some(approving_judge()), None, store.clone());
    assert!(deps_other.registry.list("z").iter().any(|t| t.tier == Tier::Shared && t.name == "slugify"));
}

#[test]
fn agents_on_one_store_see_shared_tier_changes_after_reloading_it() {
    let store = Rc::new(MemoryStore::new());
    let other = rig_for("agent2", promo_config(), Some(approving_judge()), None, store.clone());
    let r = shared_rig(store.clone());
    assert_eq!(block_on(other.registry.call("slugify", json!({ "text": "A b" }), "z")).unwrap_err().code, "unknown_tool", "loaded before the approval");
    block_on(other.registry.reload_shared()).unwrap();
    assert!(other.events.types().contains(&"registry.reloaded".to_string()));
    assert_eq!(block_on(other.registry.call("slugify", json!({ "text": "A b" }), "z")).unwrap(), json!({ "slug": "a-b" }));
    // Demoted by its owner: the other agent cannot call it at the shared tier any more.
    block_on(r.registry.demote("slugify", "s1")).unwrap();
    block_on(other.registry.reload_shared()).unwrap();
    assert_eq!(block_on(other.registry.call("slugify", json!({ "text": "A b" }), "z")).unwrap_err().code, "denied");
}

#[test]
fn agents_sharing_a_tool_add_up_its_stats_instead_of_overwriting_them() {
    let store = Rc::new(MemoryStore::new());
    let other = rig_for("agent2", promo_config(), Some(approving_judge()), None, store.clone());
    let r = promoted_rig(store.clone()); // 3 calls as a session tool
    let approval = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    block_on(r.registry.approve(&approval.id)).unwrap();
    block_on(other.registry.reload_shared()).unwrap();
    use_n(&r, "slugify", 2, "a");
    use_n(&other, "slugify", 4, "b");
    block_on(r.registry.flush_stats()).unwrap();
    block_on(other.registry.flush_stats()).unwrap();
    let stored = |store: &Rc<MemoryStore>| block_on(store.get("shared/stats/slugify")).unwrap().unwrap()["data"]["calls"].as_u64().unwrap();
    assert_eq!(stored(&store), 3 + 2 + 4, "both agents' calls are counted");
    assert_eq!(other.registry.list("b")[0].stats.calls, 9, "the flushing agent sees the total");
    // A second round from both adds up again.
    use_n(&r, "slugify", 1, "a");
    block_on(r.registry.flush_stats()).unwrap();
    assert_eq!(stored(&store), 10);
    let fresh = rig_for("agent3", promo_config(), Some(approving_judge()), None, store.clone());
    let s = &fresh.registry.list("z")[0].stats;
    assert_eq!((s.calls, s.successes, s.failures), (10, 10, 0));
}

/// A store where `slugify` is in the shared tier with 3 calls counted.
fn store_with_shared_slugify() -> Rc<MemoryStore> {
    let memory = Rc::new(MemoryStore::new());
    shared_rig(memory.clone());
    memory
}

/// The calls of the shared `slugify` as the store holds them.
fn stored_shared_calls(store: &MemoryStore) -> u64 {
    block_on(store.get("shared/stats/slugify")).unwrap().unwrap()["data"]["calls"].as_u64().unwrap()
}

#[test]
fn concurrent_flushes_of_agents_sharing_a_tool_lose_no_calls() {
    let memory = store_with_shared_slugify();
    // Two agents whose store reads wait, as real stores' do: both flushes read before either writes.
    let config = EmergentConfig { stats_flush_every: 1000, ..promo_config() };
    let agent = |id: &str| rig_over(id, config.clone(), Some(approving_judge()), None, memory.clone(), Rc::new(SharedDataStore::new(memory.clone())));
    let (a, b) = (agent("agent_a"), agent("agent_b"));
    use_n(&a, "slugify", 2, "a");
    use_n(&b, "slugify", 4, "b");
    let (fa, fb) = block_on(futures::future::join(a.registry.flush_stats(), b.registry.flush_stats()));
    fa.unwrap();
    fb.unwrap();
    assert_eq!(stored_shared_calls(&memory), 3 + 2 + 4, "neither agent's calls are lost");
}

#[test]
fn a_shared_stats_flush_holds_the_stores_lock_from_read_to_write_and_keeps_counts_it_could_not_write() {
    let memory = store_with_shared_slugify();
    let store = Rc::new(SharedDataStore::new(memory.clone()));
    let config = EmergentConfig { stats_flush_every: 1000, ..promo_config() };
    let agent = rig_over("agent_l", config, Some(approving_judge()), None, memory.clone(), store.clone());
    use_n(&agent, "slugify", 2, "a");
    // Other contexts' agents wait on the lock: it is held around the read and the write.
    store.refuse_locks.set(true);
    assert!(block_on(agent.registry.flush_stats()).is_err(), "no lock, no read-add-write");
    store.refuse_locks.set(false);
    store.log.borrow_mut().clear();
    block_on(agent.registry.flush_stats()).unwrap();
    assert_eq!(*store.log.borrow(), ["lock shared-stats", "get shared/stats/slugify", "batch", "release shared-stats"]);
    assert_eq!(stored_shared_calls(&memory), 3 + 2, "the calls the failed flush kept are written by the next");
}

#[test]
fn a_shared_stats_flush_dropped_before_its_write_keeps_its_calls_for_the_next_flush() {
    use futures::FutureExt;
    let memory = store_with_shared_slugify();
    let store = Rc::new(SharedDataStore::new(memory.clone()));
    let config = EmergentConfig { stats_flush_every: 1000, ..promo_config() };
    let agent = rig_over("agent_d", config, Some(approving_judge()), None, memory.clone(), store.clone());
    use_n(&agent, "slugify", 2, "a");
    // Dropped while it reads the stored total (the tool call awaiting it was abandoned).
    assert!(agent.registry.flush_stats().now_or_never().is_none(), "the read waits");
    assert!(!store.log.borrow().contains(&"batch".to_string()), "nothing was written");
    block_on(agent.registry.flush_stats()).unwrap();
    assert_eq!(stored_shared_calls(&memory), 3 + 2, "the dropped flush's calls are written by the next");
}

#[test]
fn an_approval_writes_the_tools_calls_to_the_shared_totals_in_the_write_that_moves_it() {
    let memory = Rc::new(MemoryStore::new());
    let store = Rc::new(SharedDataStore::new(memory.clone()));
    let config = EmergentConfig { stats_flush_every: 1000, ..promo_config() };
    let r = rig_over("agent_a", config, Some(approving_judge()), Some(approving_judge()), memory.clone(), store.clone());
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
    use_n(&r, "slugify", 4, "s1");
    block_on(r.registry.flush_stats()).unwrap();
    let approval = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    store.log.borrow_mut().clear();
    block_on(r.registry.approve(&approval.id)).unwrap();
    // Before: the approval's write deleted the agent tier's stats, and a flush after it wrote
    // the shared totals: a crash or close() between the two lost every call.
    assert_eq!(store.log.borrow().iter().filter(|l| *l == "batch").count(), 1, "{:?}", store.log.borrow());
    assert_eq!(stored_shared_calls(&memory), 7);
}

/// `owner`'s `slugify` (shared at version 1) goes on to the shared tier at version 2, with 3
/// calls as a session tool of its own.
fn approve_slugify_v2(owner: &Rig) {
    forge_ok(owner, "slugify", SLUGIFY_V2_JS, "s2");
    use_n(owner, "slugify", 3, "s2");
    assert_eq!(block_on(owner.registry.request_promotion("slugify", Tier::Agent, "s2")).unwrap().status, PromotionStatus::Promoted);
    let approval = block_on(owner.registry.request_promotion("slugify", Tier::Shared, "s2")).unwrap().approval.unwrap();
    assert_eq!(block_on(owner.registry.approve(&approval.id)).unwrap().version, 2);
}

#[test]
fn approving_a_new_version_of_a_shared_tool_adds_its_calls_to_every_agents_instead_of_replacing_them() {
    let store = Rc::new(MemoryStore::new());
    let owner = shared_rig(store.clone());
    let other = rig_for("agent2", promo_config(), Some(approving_judge()), None, store.clone());
    use_n(&other, "slugify", 4, "b");
    block_on(other.registry.flush_stats()).unwrap();
    // The owner has not seen the other agent's calls when it approves version 2.
    approve_slugify_v2(&owner);
    assert_eq!(stored_shared_calls(&store), 3 + 4 + 3);
    assert_eq!(owner.registry.list("x")[0].stats.calls, 3 + 4 + 3, "the owner sees the totals");
}

#[test]
fn rolling_back_a_shared_tool_keeps_other_agents_calls_and_counts_its_own_once() {
    let store = Rc::new(MemoryStore::new());
    let owner = shared_rig(store.clone());
    approve_slugify_v2(&owner);
    let before = stored_shared_calls(&store);
    let other = rig_for("agent2", promo_config(), Some(approving_judge()), None, store.clone());
    use_n(&other, "slugify", 4, "b");
    block_on(other.registry.flush_stats()).unwrap();
    // The owner rolls back without having seen the other agent's calls.
    assert_eq!(block_on(owner.registry.rollback("slugify", 1, "x")).unwrap().version, 1);
    assert_eq!(stored_shared_calls(&store), before + 4, "the other agent's calls stay counted");
    use_n(&owner, "slugify", 3, "x");
    block_on(owner.registry.rollback("slugify", 2, "x")).unwrap();
    assert_eq!(stored_shared_calls(&store), before + 4, "calls not flushed yet are not written by a rollback");
    block_on(owner.registry.flush_stats()).unwrap();
    assert_eq!(stored_shared_calls(&store), before + 4 + 3, "the flush counts them once");
    let fresh = rig_for("agent3", promo_config(), Some(approving_judge()), None, store.clone());
    assert_eq!(fresh.registry.list("z")[0].stats.calls, before + 4 + 3);
}

#[test]
fn demoting_a_shared_tool_keeps_other_agents_calls_and_counts_its_own_once() {
    let store = Rc::new(MemoryStore::new());
    let owner = shared_rig(store.clone());
    let other = rig_for("agent2", promo_config(), Some(approving_judge()), None, store.clone());
    use_n(&other, "slugify", 4, "b");
    block_on(other.registry.flush_stats()).unwrap();
    use_n(&owner, "slugify", 2, "x");
    // The shared tombstone keeps the calls the tool got at the shared tier.
    assert_eq!(block_on(owner.registry.demote("slugify", "x")).unwrap().tier, Tier::Agent);
    assert_eq!(stored_shared_calls(&store), 3 + 4, "a demotion does not write the shared totals");
    block_on(owner.registry.flush_stats()).unwrap();
    assert_eq!(stored_shared_calls(&store), 3 + 4 + 2, "the owner's calls made before the demotion are added once");
    let fresh = rig_for("agent3", promo_config(), Some(approving_judge()), None, store.clone());
    let tombstone = &fresh.registry.list("z")[0];
    assert_eq!((tombstone.status, tombstone.stats.calls), (ToolStatus::Demoted, 3 + 4 + 2));
}

#[test]
fn a_shared_tool_demoted_and_approved_again_counts_its_shared_calls_once() {
    let store = Rc::new(MemoryStore::new());
    let owner = shared_rig(store.clone());
    use_n(&owner, "slugify", 2, "x");
    block_on(owner.registry.flush_stats()).unwrap();
    let shared_calls = stored_shared_calls(&store);
    block_on(owner.registry.demote("slugify", "x")).unwrap();
    use_n(&owner, "slugify", 1, "x");
    let approval = block_on(owner.registry.request_promotion("slugify", Tier::Shared, "x")).unwrap().approval.unwrap();
    block_on(owner.registry.approve(&approval.id)).unwrap();
    block_on(owner.registry.flush_stats()).unwrap();
    assert_eq!(stored_shared_calls(&store), shared_calls + 1, "the shared calls once, and the one made at the agent tier");
    assert_eq!(owner.registry.list("x")[0].stats.calls, shared_calls + 1);
}

#[test]
fn a_promotion_that_cannot_be_recorded_is_not_asked_again_on_every_use() {
    for panel_approves in [false, true] {
        let memory = Rc::new(MemoryStore::new());
        let store = Rc::new(SharedDataStore::new(memory.clone()));
        let panel = judge_replying(vec![text(&verdict(panel_approves, 0.9, 0.9)); 8]);
        let config = EmergentConfig { auto_promote: true, ..promo_config() };
        let r = rig_over("agent1", config, Some(approving_judge()), Some(panel.clone()), memory, store.clone());
        forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
        // A full store from here on.
        store.refuse_writes.set(true);
        use_n(&r, "slugify", 4, "s1");
        assert_eq!(panel.requests.borrow().len(), 2, "one panel (two reviewers) for the third use, none for the fourth (panel approves: {panel_approves})");
        assert_eq!(r.registry.list("s1")[0].tier, Tier::Session);
    }
}

/// The error a judge's deadline (the host's `timeoutMs`) gives the core.
fn judge_deadline() -> support::Reply {
    support::Reply::Fail(crucible::model::ModelError::new("provider_timeout", "no complete verdict within 50 ms (emergent.judge.timeoutMs)"))
}

#[test]
fn a_panel_that_did_not_answer_in_time_is_not_remembered_as_a_rejection() {
    let panel = judge_replying(vec![judge_deadline(), text(&verdict(true, 0.9, 0.9)), text(&verdict(true, 0.9, 0.9))]);
    let r = rig_with(promo_config(), Some(approving_judge()), Some(panel.clone()), Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    let out = block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap();
    assert_eq!(out.status, PromotionStatus::Rejected, "{out:?}");
    assert!(out.reason.contains("the judge did not answer: no complete verdict within 50 ms"), "{}", out.reason);
    assert_eq!(r.registry.list("s1")[0].tier, Tier::Session, "still callable where it was");
    use_n(&r, "slugify", 1, "s1");
    // Asked again at once (a rejection would be suppressed for promotionRetryUses more uses).
    let out = block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap();
    assert_eq!(out.status, PromotionStatus::Promoted, "{out:?}");
}

#[test]
fn a_forge_whose_judge_did_not_answer_in_time_is_rejected_saying_so() {
    let r = rig_with(promo_config(), Some(judge_replying(vec![judge_deadline()])), Some(approving_judge()), Rc::new(MemoryStore::new()));
    let res = block_on(r.registry.forge(&slugify_request("slugify", SLUGIFY_JS), "s1"));
    assert!(!res.success);
    assert_eq!(res.category, Some(RejectionCategory::Other));
    assert_eq!(
        res.reason.as_deref(),
        Some("no verdict, so the tool is rejected: the judge did not answer: no complete verdict within 50 ms (emergent.judge.timeoutMs)")
    );
}

#[test]
fn an_unanswered_automatic_promotion_is_held_off_but_an_explicit_request_asks_again() {
    let config = EmergentConfig { auto_promote: true, ..promo_config() };
    let panel = judge_replying(vec![judge_deadline(), text(&verdict(true, 0.9, 0.9)), text(&verdict(true, 0.9, 0.9))]);
    let r = rig_with(config, Some(approving_judge()), Some(panel.clone()), Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(panel.requests.borrow().len(), 1, "the third use asked the panel, whose first reviewer did not answer");
    use_n(&r, "slugify", 1, "s1");
    assert_eq!(panel.requests.borrow().len(), 1, "a stalled judge does not hold every later use for its deadline");
    let out = block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap();
    assert_eq!(out.status, PromotionStatus::Promoted, "{out:?}");
}

#[test]
fn without_a_background_executor_an_automatic_promotion_runs_in_its_call_under_the_call_s_run_id() {
    let config = EmergentConfig { auto_promote: true, ..promo_config() };
    let panel = approving_judge();
    let r = rig_with(config, Some(approving_judge()), Some(panel.clone()), Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 2, "s1");
    block_on(r.registry.call_as("slugify", json!({ "text": "A b" }), "s1", "run_7", Default::default())).unwrap();
    // The host finds the run's abort signal for the judge's request by this id.
    assert_eq!(*panel.run_ids.borrow(), ["run_7", "run_7"]);
    assert_eq!(r.registry.list("s1")[0].tier, Tier::Agent);
}

/// A rig whose `slugify` has the uses for promotion, with a panel that stalls on its first
/// review and approves after.
fn rig_with_stalling_panel() -> (Rig, Rc<StallingJudge>) {
    let panel = StallingJudge::new(1, approving_judge());
    let memory = Rc::new(MemoryStore::new());
    let judge: Rc<dyn crucible::model::Model> = approving_judge();
    let r = rig_of_models("agent1", promo_config(), Some(judge), Some(panel.clone()), memory.clone(), memory);
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    (r, panel)
}

/// Polls `future` until `panel` was asked (the review is under way), or it finished.
fn poll_until_asked<T>(future: std::pin::Pin<&mut impl std::future::Future<Output = T>>, panel: &StallingJudge) -> Option<T> {
    let mut future = future;
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    for _ in 0..1000 {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return Some(out);
        }
        if panel.asked.get() > 0 {
            return None;
        }
    }
    panic!("the panel was never asked");
}

#[test]
fn a_promotion_dropped_mid_review_leaves_no_review_marker_and_no_memo() {
    let (r, panel) = rig_with_stalling_panel();
    {
        let review = std::pin::pin!(r.registry.request_promotion("slugify", Tier::Agent, "s1"));
        assert!(poll_until_asked(review, &panel).is_none(), "the stalled reviewer holds the review");
    } // Dropped here, as a run's abort drops the call that started an automatic promotion.
    let out = block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap();
    assert_eq!(out.status, PromotionStatus::Promoted, "neither `already under review` nor suppressed: {out:?}");
}

#[test]
fn a_cancelled_promotion_fails_aborted_and_records_nothing() {
    let (r, panel) = rig_with_stalling_panel();
    let flag = crucible::agent::CancelFlag::default();
    let mut review = std::pin::pin!(r.registry.request_promotion_cancellable("slugify", Tier::Agent, "s1", Some(&flag), "direct_1"));
    assert!(poll_until_asked(review.as_mut(), &panel).is_none());
    flag.cancel();
    let out = block_on(review);
    assert!(matches!(out, Err(RegistryError::Aborted(_))), "{out:?}");
    assert_eq!(out.unwrap_err().code(), "aborted");
    assert!(!r.events.types().iter().any(|t| t == "promotion.rejected"), "an abort is no rejection");
    assert_eq!(r.registry.list("s1")[0].tier, Tier::Session);
    let out = block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap();
    assert_eq!(out.status, PromotionStatus::Promoted, "{out:?}");
}

/// A rig that promotes by itself in the background of `env`, with `slugify` forged in `s1`
/// and used twice (one use short of the threshold), and a panel that answers when its gate opens.
fn background_rig() -> (Rig, Rc<SpawningEnvironment>, Rc<GatedJudge>) {
    let env = Rc::new(SpawningEnvironment::default());
    let panel = GatedJudge::new(approving_judge());
    let memory = Rc::new(MemoryStore::new());
    let judge: Rc<dyn crucible::model::Model> = approving_judge();
    let config = EmergentConfig { auto_promote: true, ..promo_config() };
    let r = rig_in(env.clone(), "agent1", config, Some(judge), Some(panel.clone()), memory.clone(), memory);
    r.registry.set_background_run_id("background_1");
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 2, "s1");
    (r, env, panel)
}

/// The call's result when it finished without waiting for anything outside it (the executor
/// never runs here: a call that waits for a review would never finish).
fn call_now(r: &Rig, run_id: &str) -> serde_json::Value {
    let call = std::pin::pin!(r.registry.call_as("slugify", json!({ "text": "A b" }), "s1", run_id, Default::default()));
    match call.poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
        std::task::Poll::Ready(out) => out.unwrap(),
        std::task::Poll::Pending => panic!("the call waited (for the promotion's review)"),
    }
}

/// Whether the registry's background work is done, without waiting for it.
fn is_settled(r: &Rig) -> bool {
    std::pin::pin!(r.registry.settled()).poll(&mut std::task::Context::from_waker(std::task::Waker::noop())).is_ready()
}

#[test]
fn the_call_that_starts_an_automatic_promotion_returns_before_the_review_and_the_review_finishes_in_the_background() {
    let (r, env, panel) = background_rig();
    assert_eq!(call_now(&r, "run_7"), json!({ "slug": "a-b" }), "the third use returns its result at once");
    assert!(!is_settled(&r), "its promotion is in flight");
    env.run_background();
    assert_eq!(panel.asked.get(), 1, "the safety reviewer is asked, and has not answered");
    assert_eq!(r.registry.list("s1")[0].tier, Tier::Session);
    // Neither the run ending nor more uses disturb the review, or start a second one.
    call_now(&r, "run_8");
    env.run_background();
    assert_eq!(panel.asked.get(), 1, "one review at a time");
    panel.gate.cancel();
    env.run_background();
    assert!(is_settled(&r));
    assert_eq!(panel.asked.get(), 2, "both reviewers answered");
    assert_eq!(r.registry.list("s1")[0].tier, Tier::Agent);
    assert!(r.events.bodies().iter().any(|b| matches!(b, EventBody::ToolPromoted { name, .. } if name == "slugify")));
    assert!(r.registry.audit_trail().iter().any(|a| a.action == "promote" && a.detail.contains("panel approved")));
    let promoted_in: Vec<String> = r.events.0.borrow().iter().filter(|e| matches!(e.body, EventBody::ToolPromoted { .. })).map(|e| e.run_id.clone()).collect();
    assert_eq!(promoted_in, [""], "its events belong to no run (which may have ended): they reach the agent's listeners");
}

#[test]
fn the_background_panel_is_asked_under_the_background_run_id() {
    let env = Rc::new(SpawningEnvironment::default());
    let panel = approving_judge();
    let config = EmergentConfig { auto_promote: true, ..promo_config() };
    let memory = Rc::new(MemoryStore::new());
    let r = rig_in(env.clone(), "agent1", config, Some(approving_judge()), Some(panel.clone()), memory.clone(), memory);
    r.registry.set_background_run_id("background_1");
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 2, "s1");
    call_now(&r, "run_7");
    env.run_background();
    assert_eq!(*panel.run_ids.borrow(), ["background_1", "background_1"], "not run_7: ending that run must not abort the review");
    assert_eq!(r.registry.list("s1")[0].tier, Tier::Agent);
}

#[test]
fn closing_the_registry_aborts_a_background_promotion_and_records_nothing() {
    let (r, env, panel) = background_rig();
    call_now(&r, "run_7");
    env.run_background();
    assert_eq!(panel.asked.get(), 1);
    let audited = r.registry.audit_trail().len();
    r.registry.close();
    env.run_background();
    assert!(is_settled(&r), "the review ended at the close");
    panel.gate.cancel();
    env.run_background();
    assert_eq!(panel.asked.get(), 1, "the correctness reviewer is never asked");
    assert_eq!(r.registry.list("s1")[0].tier, Tier::Session);
    assert_eq!(r.registry.audit_trail().len(), audited, "nothing audited");
    assert!(!r.events.types().iter().any(|t| t == "tool.promoted" || t == "promotion.rejected"), "{:?}", r.events.types());
}

#[test]
fn a_stopped_registry_starts_no_background_promotion() {
    let (r, env, panel) = background_rig();
    r.registry.stop_background();
    call_now(&r, "run_7");
    env.run_background();
    assert!(is_settled(&r));
    assert_eq!(panel.asked.get(), 0);
}

#[test]
fn a_background_promotion_approved_after_its_session_ended_still_promotes_the_tool() {
    let (r, env, panel) = background_rig();
    call_now(&r, "run_7");
    env.run_background();
    assert_eq!(panel.asked.get(), 1, "under review");
    // The run that made the call ended, and its host ends the session, as a service does after
    // each request: the review goes on, and what the panel approves reaches the agent tier.
    block_on(r.registry.end_session("s1")).unwrap();
    panel.gate.cancel();
    env.run_background();
    assert!(is_settled(&r));
    let listed: Vec<(String, Tier)> = r.registry.list("s2").into_iter().map(|t| (t.name, t.tier)).collect();
    assert_eq!(listed, [("slugify".to_string(), Tier::Agent)]);
    assert!(r.events.bodies().iter().any(|b| matches!(b, EventBody::ToolPromoted { name, .. } if name == "slugify")));
    assert!(r.registry.audit_trail().iter().any(|a| a.action == "promote" && a.detail.contains("panel approved")));
}

/// A rig whose automatic promotion of `slugify` the panel approved and the store (refusing
/// writes from then on) did not record, with the memory behind that store.
fn background_promotion_the_store_refused() -> (Rig, Rc<MemoryStore>, Rc<SharedDataStore>) {
    let env = Rc::new(SpawningEnvironment::default());
    let panel = GatedJudge::new(approving_judge());
    let memory = Rc::new(MemoryStore::new());
    let store = Rc::new(SharedDataStore::new(memory.clone()));
    let config = EmergentConfig { auto_promote: true, ..promo_config() };
    let r = rig_in(env.clone(), "agent1", config, Some(approving_judge()), Some(panel.clone()), memory.clone(), store.clone());
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 2, "s1");
    call_now(&r, "run_7");
    env.run_background();
    store.refuse_writes.set(true);
    panel.gate.cancel();
    env.run_background();
    assert!(is_settled(&r));
    assert_eq!(r.registry.list("s1")[0].tier, Tier::Session, "not promoted");
    (r, memory, store)
}

#[test]
fn a_background_promotion_the_store_refuses_to_record_is_in_the_audit_trail_and_written_with_the_next_write() {
    let (r, memory, store) = background_promotion_the_store_refused();
    let recorded = |trail: Vec<crucible::registry::AuditEntry>| {
        trail
            .into_iter()
            .any(|a| a.action == "promote" && a.version == Some(1) && a.detail.contains("could not be recorded") && a.detail.contains("the store is full"))
    };
    assert!(recorded(r.registry.audit_trail()), "{:?}", r.registry.audit_trail());
    store.refuse_writes.set(false);
    forge_ok(&r, "other", SLUGIFY_JS, "s1");
    let reopened = rig_for("agent1", promo_config(), Some(approving_judge()), None, memory);
    assert!(recorded(reopened.registry.audit_trail()), "the provenance record survives a restart");
}

#[test]
fn a_background_promotion_the_store_refuses_to_record_is_told_to_the_agent_s_listeners() {
    let (r, _, _) = background_promotion_the_store_refused();
    // Nobody awaits a background promotion: its failure is an event, or it is told nowhere.
    let rejected: Vec<String> = r
        .events
        .bodies()
        .into_iter()
        .filter_map(|b| match b {
            EventBody::PromotionRejected { name, reason, .. } if name == "slugify" => Some(reason),
            _ => None,
        })
        .collect();
    assert_eq!(rejected.len(), 1, "{:?}", r.events.types());
    assert!(rejected[0].contains("could not be recorded") && rejected[0].contains("the store is full"), "{}", rejected[0]);
}

/// A rig that promotes by itself (approving judge and panel) with `slugify` forged in `s1`, and
/// its panel, to count the reviews.
fn auto_promoting_rig_with_slugify() -> (Rig, Rc<support::ScriptedModel>) {
    let config = EmergentConfig { auto_promote: true, ..promo_config() };
    let panel = approving_judge();
    let r = rig_with(config, Some(approving_judge()), Some(panel.clone()), Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    (r, panel)
}

#[test]
fn forge_tests_of_a_pipeline_are_not_uses_of_its_step_tools() {
    let (r, panel) = auto_promoting_rig_with_slugify();
    let slug_schema = json!({ "type": "object", "properties": { "slug": { "type": "string" } }, "required": ["slug"] });
    let text_schema = json!({ "type": "object", "properties": { "text": { "type": "string" } }, "required": ["text"] });
    let pipeline = |expected: &str| {
        let cases: Vec<_> = (1..=3).map(|i| json!({ "input": { "text": format!("T {i}") }, "expectedOutput": { "slug": format!("{expected}{i}") } })).collect();
        json!({
            "name": "relay_slug", "description": "slugify through a pipeline", "inputSchema": text_schema, "outputSchema": slug_schema,
            "implementation": { "mode": "compose", "steps": [{ "name": "s", "tool": "slugify", "inputMapping": { "text": "$input.text" } }] },
            "testCases": cases
        })
    };
    // Three tests run slugify three times (the promotion threshold), and fail.
    assert!(!block_on(r.registry.forge(&pipeline("wrong-"), "s1")).success);
    assert!(block_on(r.registry.forge(&pipeline("t-"), "s1")).success);
    let slugify = r.registry.list("s1").into_iter().find(|t| t.name == "slugify").unwrap();
    assert_eq!((slugify.tier, slugify.stats.calls), (Tier::Session, 0), "six test runs, no uses");
    assert_eq!(panel.requests.borrow().len(), 0, "no promotion was attempted");
    // A real call through the pipeline is a use of both.
    block_on(r.registry.call("relay_slug", json!({ "text": "A b" }), "s1")).unwrap();
    let calls: Vec<(String, u64)> = r.registry.list("s1").into_iter().map(|t| (t.name, t.stats.calls)).collect();
    assert_eq!(calls, [("relay_slug".to_string(), 1), ("slugify".to_string(), 1)]);
}

#[test]
fn a_promotion_whose_tests_fail_on_re_run_is_refused_before_the_panel_is_asked() {
    let panel = approving_judge();
    let r = rig_with(promo_config(), Some(approving_judge()), Some(panel.clone()), Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", DRIFTS_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    let out = block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap();
    assert_eq!(out.status, PromotionStatus::Rejected, "{out:?}");
    assert!(out.reason.contains("tests failed on re-run") && out.reason.contains("drifted"), "{}", out.reason);
    assert_eq!(panel.requests.borrow().len(), 0, "the panel is not asked about a tool whose tests fail");
    assert_eq!(r.registry.list("s1")[0].tier, Tier::Session);
}

#[test]
fn approving_after_the_tool_was_demoted_keeps_its_tombstone() {
    let r = promoted_rig(Rc::new(MemoryStore::new()));
    let approval = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    block_on(r.registry.demote("slugify", "s2")).unwrap();
    assert!(matches!(block_on(r.registry.approve(&approval.id)), Err(RegistryError::NoSuchApproval(_))), "the request was withdrawn");
    // Still a demoted tool at the agent tier: other sessions are refused, not told it is unknown.
    assert_eq!(block_on(r.registry.call("slugify", json!({ "text": "x" }), "s3")).unwrap_err().code, "denied");
    assert!(r.registry.list("s3").iter().all(|t| t.tier != Tier::Shared));
}

/// The `promotion.rejected` events that told of a shared-tier request for `name` withdrawn.
fn withdrawals(r: &Rig, name: &str) -> Vec<String> {
    let bodies = r.events.bodies().into_iter();
    bodies
        .filter_map(|b| match b {
            EventBody::PromotionRejected { name: n, from_tier: Tier::Agent, to_tier: Tier::Shared, reason } if n == name => Some(reason),
            _ => None,
        })
        .collect()
}

#[test]
fn a_pending_shared_request_is_withdrawn_when_its_tool_is_demoted_out_of_the_agent_tier() {
    let store = Rc::new(MemoryStore::new());
    let r = promoted_rig(store.clone());
    let approval = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    block_on(r.registry.demote("slugify", "s2")).unwrap();
    assert!(r.registry.pending_approvals().is_empty(), "no longer listed");
    let told = withdrawals(&r, "slugify");
    assert_eq!(told.len(), 1, "whoever waits for the answer is told: {:?}", r.events.types());
    assert!(told[0].contains(&approval.id) && told[0].contains("withdrawn") && told[0].contains("demoted"), "{}", told[0]);
    let withdrawn = r.registry.audit_trail().into_iter().find(|a| a.action == "approval.withdrawn").expect("an approval.withdrawn entry");
    assert!(withdrawn.detail.starts_with(&approval.id), "{}", withdrawn.detail);
    assert!(matches!(block_on(r.registry.approve(&approval.id)), Err(RegistryError::NoSuchApproval(_))));
    let fresh = rig_with(promo_config(), Some(approving_judge()), None, store);
    assert!(fresh.registry.pending_approvals().is_empty(), "withdrawn in the store too");
    assert!(fresh.registry.audit_trail().iter().any(|a| a.action == "approval.withdrawn"));
}

#[test]
fn a_pending_shared_request_is_withdrawn_when_the_agent_tier_rolls_back_to_another_version() {
    let r = promoted_rig(Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_V2_JS, "s2");
    use_n(&r, "slugify", 3, "s2");
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, "s2")).unwrap().status, PromotionStatus::Promoted);
    let approval = block_on(r.registry.request_promotion("slugify", Tier::Shared, "x")).unwrap().approval.unwrap();
    // A rollback to the version it already is changes nothing the request asks for.
    assert_eq!(block_on(r.registry.rollback("slugify", 2, "x")).unwrap().version, 2);
    assert_eq!(r.registry.pending_approvals(), vec![approval.clone()]);
    assert_eq!(block_on(r.registry.rollback("slugify", 1, "x")).unwrap().version, 1);
    assert!(r.registry.pending_approvals().is_empty());
    let told = withdrawals(&r, "slugify");
    assert!(told.len() == 1 && told[0].contains("rolled back"), "{told:?}");
    assert!(matches!(block_on(r.registry.approve(&approval.id)), Err(RegistryError::NoSuchApproval(_))));
}

/// A store as a build before pending shared requests were withdrawn left it: `slugify`'s request
/// (its id and key returned) kept beside the demotion of the version it asks for.
fn store_with_a_stale_shared_request() -> (Rc<MemoryStore>, String, String) {
    let store = Rc::new(MemoryStore::new());
    let r = promoted_rig(store.clone());
    let approval = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    let key = format!("agent/agent1/approval/{}", approval.id);
    let stored = block_on(store.get(&key)).unwrap().expect("the request is stored");
    block_on(r.registry.demote("slugify", "s2")).unwrap();
    block_on(store.put(&key, stored)).unwrap();
    // That build did not withdraw it: its trail has no `approval.withdrawn`.
    for (audit_key, entry) in block_on(store.scan("agent/agent1/audit/")).unwrap() {
        if entry["data"]["action"] == "approval.withdrawn" {
            block_on(store.delete(&audit_key)).unwrap();
        }
    }
    (store, approval.id, key)
}

/// How many `approval.withdrawn` entries of `r`'s audit trail name the request `id`.
fn withdrawn_entries(r: &Rig, id: &str) -> usize {
    r.registry.audit_trail().into_iter().filter(|a| a.action == "approval.withdrawn" && a.detail.starts_with(id)).count()
}

#[test]
fn a_stored_shared_request_whose_version_already_left_the_agent_tier_is_withdrawn_at_load() {
    let (store, id, key) = store_with_a_stale_shared_request();
    let fresh = rig_with(promo_config(), Some(approving_judge()), None, store.clone());
    assert!(fresh.registry.pending_approvals().is_empty(), "a request that cannot be approved is not listed");
    assert!(matches!(block_on(fresh.registry.approve(&id)), Err(RegistryError::NoSuchApproval(_))));
    let audited = fresh.registry.audit_trail().into_iter().last().unwrap();
    assert_eq!((audited.action.as_str(), audited.tool.as_str()), ("approval.withdrawn", "slugify"));
    assert!(audited.detail.starts_with(&id) && audited.detail.contains("before this agent loaded"), "{}", audited.detail);
    assert_eq!(withdrawn_entries(&fresh, &id), 1);
    assert!(block_on(store.get(&key)).unwrap().is_none(), "withdrawn in the store too");
    let again = rig_with(promo_config(), Some(approving_judge()), None, store);
    assert_eq!(withdrawn_entries(&again, &id), 1, "withdrawn once at load, not at every load");
}

#[test]
fn a_stale_shared_request_the_store_refuses_to_withdraw_at_load_is_not_listed_and_withdrawn_at_the_next_load() {
    let (memory, id, key) = store_with_a_stale_shared_request();
    let refusing = Rc::new(SharedDataStore::new(memory.clone()));
    refusing.refuse_writes.set(true);
    let r = rig_over("agent1", promo_config(), Some(approving_judge()), None, memory.clone(), refusing);
    assert!(r.registry.pending_approvals().is_empty(), "the agent loads, without the request");
    assert!(block_on(memory.get(&key)).unwrap().is_some(), "the refused write left it stored");
    let again = rig_with(promo_config(), Some(approving_judge()), None, memory.clone());
    assert!(again.registry.pending_approvals().is_empty());
    assert!(block_on(memory.get(&key)).unwrap().is_none());
    assert_eq!(withdrawn_entries(&again, &id), 1);
}

#[test]
fn a_withdrawal_at_load_the_store_refused_is_audited_once_though_a_later_write_carried_its_audit_entry() {
    let (memory, id, key) = store_with_a_stale_shared_request();
    let refusing = Rc::new(SharedDataStore::new(memory.clone()));
    refusing.refuse_writes.set(true);
    let r = rig_over("agent1", promo_config(), Some(approving_judge()), None, memory.clone(), refusing.clone());
    refusing.refuse_writes.set(false);
    // The next write carries the audit entry the refused one left out, but not the request's
    // delete: the next load finds the request stored and withdraws it again.
    forge_ok(&r, "slug", SLUGIFY_JS, "s1");
    assert!(block_on(memory.get(&key)).unwrap().is_some(), "the refused delete is not retried");
    let stored = block_on(memory.scan("agent/agent1/audit/")).unwrap();
    assert_eq!(stored.iter().filter(|(_, e)| e["data"]["action"] == "approval.withdrawn").count(), 1, "the carried audit entry");
    let again = rig_with(promo_config(), Some(approving_judge()), None, memory.clone());
    assert!(again.registry.pending_approvals().is_empty());
    assert!(block_on(memory.get(&key)).unwrap().is_none(), "withdrawn in the store this time");
    assert_eq!(withdrawn_entries(&again, &id), 1, "one request, audited withdrawn once");
    let third = rig_with(promo_config(), Some(approving_judge()), None, memory);
    assert_eq!(withdrawn_entries(&third, &id), 1);
}

#[test]
fn a_stored_shared_request_for_the_version_in_service_is_kept_at_load() {
    let store = Rc::new(MemoryStore::new());
    let r = promoted_rig(store.clone());
    let approval = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    let fresh = rig_with(promo_config(), Some(approving_judge()), None, store);
    assert_eq!(fresh.registry.pending_approvals(), vec![approval.clone()]);
    assert_eq!(block_on(fresh.registry.approve(&approval.id)).unwrap().tier, Tier::Shared);
}

#[test]
fn a_pending_shared_request_is_kept_when_a_demotion_or_rollback_cannot_be_written() {
    let memory = Rc::new(MemoryStore::new());
    let store = Rc::new(SharedDataStore::new(memory.clone()));
    let r = rig_over("agent1", promo_config(), Some(approving_judge()), Some(approving_judge()), memory, store.clone());
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
    let approval = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    store.refuse_writes.set(true);
    assert!(block_on(r.registry.demote("slugify", "s2")).is_err());
    assert_eq!(r.registry.pending_approvals(), vec![approval], "nothing changed, nothing withdrawn");
    assert!(withdrawals(&r, "slugify").is_empty());
}

#[test]
fn approving_does_not_overwrite_another_agents_shared_tool() {
    let store = Rc::new(MemoryStore::new());
    shared_rig(store.clone());

    let second = rig_for("agent2", promo_config(), Some(approving_judge()), Some(approving_judge()), store.clone());
    block_on(second.registry.forge(&slugify_request("slugify", SLUGIFY_V2_JS), "t1"));
    use_n(&second, "slugify", 3, "t1");
    assert_eq!(block_on(second.registry.request_promotion("slugify", Tier::Agent, "t1")).unwrap().status, PromotionStatus::Promoted);
    let approval = block_on(second.registry.request_promotion("slugify", Tier::Shared, "t1")).unwrap().approval.unwrap();
    let err = block_on(second.registry.approve(&approval.id)).unwrap_err();
    // Said without naming the other agent (another tenant's id, maybe).
    assert!(matches!(err, RegistryError::InvalidPromotion { .. }) && err.to_string().contains("already has another agent's `slugify`"), "{err}");
    assert!(!err.to_string().contains("agent1"), "{err}");
    // agent1's shared tool is untouched; agent2's stays at its agent tier.
    let stored = block_on(store.get("shared/tool/slugify")).unwrap().unwrap();
    assert_eq!(stored["data"]["origin"]["agentId"], "agent1");
    assert!(second.registry.list("t1").iter().any(|t| t.name == "slugify" && t.tier == Tier::Agent));
}

/// The shared-tier record of `name` as the store holds it: (owner, current version, versions).
fn stored_shared_record(store: &MemoryStore, name: &str) -> Option<(String, u64, Vec<u64>)> {
    let value = block_on(store.get(&format!("shared/tool/{name}"))).unwrap()?;
    let data = &value["data"];
    let versions = data["history"].as_array().unwrap().iter().map(|v| v["version"].as_u64().unwrap()).collect();
    Some((data["origin"]["agentId"].as_str().unwrap().to_string(), data["current"]["version"].as_u64().unwrap(), versions))
}

#[test]
fn an_approval_decides_on_the_shared_tier_the_store_holds_not_on_the_agents_copy_of_it() {
    let store = Rc::new(MemoryStore::new());
    let first = promoted_rig(store.clone());
    let second = rig_for("agent2", promo_config(), Some(approving_judge()), Some(approving_judge()), store.clone());
    forge_ok(&second, "slugify", SLUGIFY_V2_JS, "t1");
    use_n(&second, "slugify", 3, "t1");
    assert_eq!(block_on(second.registry.request_promotion("slugify", Tier::Agent, "t1")).unwrap().status, PromotionStatus::Promoted);
    let ask = |r: &Rig, session: &str| block_on(r.registry.request_promotion("slugify", Tier::Shared, session)).unwrap().approval.unwrap();
    let (asked_first, asked_second) = (ask(&first, "s1"), ask(&second, "t1"));
    block_on(first.registry.approve(&asked_first.id)).unwrap();
    // The second agent has not reloaded the shared tier since.
    let refused = block_on(second.registry.approve(&asked_second.id)).unwrap_err();
    assert!(matches!(refused, RegistryError::InvalidPromotion { .. }), "{refused:?}");
    assert_eq!(stored_shared_record(&store, "slugify").map(|r| r.0), Some("agent1".to_string()));
    assert!(block_on(store.get("agent/agent2/tool/slugify")).unwrap().is_some(), "the refused agent keeps its tool");
}

#[test]
fn a_rollback_by_an_agent_that_has_not_seen_the_latest_approval_keeps_the_approved_version() {
    let store = Rc::new(MemoryStore::new());
    let owner = shared_rig(store.clone());
    let other = rig_for("agent2", promo_config(), Some(approving_judge()), None, store.clone());
    approve_slugify_v2(&owner);
    assert_eq!(block_on(other.registry.rollback("slugify", 1, "b")).unwrap().version, 1);
    assert_eq!(stored_shared_record(&store, "slugify"), Some(("agent1".to_string(), 1, vec![1, 2])), "version 2 stays in the history");
}

#[test]
fn a_shared_tool_another_agent_demotes_is_back_in_its_owners_agent_tier_after_a_reload() {
    let store = Rc::new(MemoryStore::new());
    let owner = shared_rig(store.clone());
    let other = rig_for("agent2", promo_config(), Some(approving_judge()), None, store.clone());
    assert_eq!(block_on(other.registry.demote("slugify", "b")).unwrap().tier, Tier::Agent);
    block_on(owner.registry.reload_shared()).unwrap();
    let tiers: Vec<_> = owner.registry.list("s1").into_iter().map(|t| (t.tier, t.status)).collect();
    assert!(tiers.contains(&(Tier::Agent, ToolStatus::Active)), "{tiers:?}");
    assert!(block_on(owner.registry.call("slugify", json!({ "text": "A b" }), "s1")).is_ok());
}

#[test]
fn a_shared_tool_another_agent_demotes_is_recorded_once_in_its_owners_audit_trail() {
    let store = Rc::new(MemoryStore::new());
    let owner = shared_rig(store.clone());
    let other = rig_for("agent2", promo_config(), Some(approving_judge()), None, store.clone());
    block_on(other.registry.demote("slugify", "b")).unwrap();
    assert!(demotions(&owner).is_empty(), "not seen yet");
    // How the change reaches the owner: the runtime's other agents (or other tabs) reload.
    block_on(owner.registry.reload_shared()).unwrap();
    block_on(owner.registry.reload_shared()).unwrap();
    let recorded = demotions(&owner);
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!((recorded[0].0, recorded[0].1), (Some(1), Some(Tier::Agent)));
    assert!(recorded[0].2.contains("another agent (`agent2`) demoted it from the shared tier"), "{}", recorded[0].2);
    // Audited live, its notice is cleared with it: the next load does not audit it again.
    let reopened = rig_for("agent1", promo_config(), Some(approving_judge()), None, store);
    assert_eq!(demotions(&reopened), recorded, "persisted");
}

/// The `demote` entries of `slugify` in `r`'s audit trail: (version, tier, detail).
fn demotions(r: &Rig) -> Vec<(Option<u32>, Option<Tier>, String)> {
    let trail = r.registry.audit_trail().into_iter();
    trail.filter(|a| a.action == "demote" && a.tool == "slugify").map(|a| (a.version, a.tier, a.detail)).collect()
}

/// agent1 shares `slugify` (running `prepare` on it), closes, and agent2 demotes the shared
/// tool: the demoting agent's rig.
fn demoted_by_another_while_its_owner_is_closed(store: &Rc<MemoryStore>, prepare: impl FnOnce(&Rig)) -> Rig {
    let owner = shared_rig(store.clone());
    prepare(&owner);
    owner.registry.close();
    let other = rig_for("agent2", promo_config(), Some(approving_judge()), None, store.clone());
    block_on(other.registry.demote("slugify", "b")).unwrap();
    other
}

#[test]
fn a_shared_tool_another_agent_demotes_while_its_owner_is_closed_is_recorded_once_in_its_owners_trail_when_it_loads() {
    let store = Rc::new(MemoryStore::new());
    let other = demoted_by_another_while_its_owner_is_closed(&store, |_| {});
    std::thread::sleep(std::time::Duration::from_millis(5));
    let reopened = rig_for("agent1", promo_config(), Some(approving_judge()), None, store.clone());
    let recorded = demotions(&reopened);
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!((recorded[0].0, recorded[0].1), (Some(1), Some(Tier::Agent)));
    assert!(recorded[0].2.contains("another agent (`agent2`) demoted it from the shared tier to this agent's tier"), "{}", recorded[0].2);
    // Made in the demotion, just before the demoter's own entry: not when its owner loaded.
    let dated = |r: &Rig| r.registry.audit_trail().into_iter().rfind(|a| a.action == "demote").map(|a| a.at).unwrap();
    assert!(dated(&reopened) <= dated(&other), "{} > {}", dated(&reopened), dated(&other));
    block_on(reopened.registry.reload_shared()).unwrap();
    assert_eq!(demotions(&reopened), recorded, "a reload does not record it again");
    reopened.registry.close();
    let again = rig_for("agent1", promo_config(), Some(approving_judge()), None, store);
    assert_eq!(demotions(&again), recorded, "persisted, and not recorded again");
}

#[test]
fn a_closed_owners_trail_says_its_agent_tier_kept_its_own_newer_version_when_another_agent_demoted_the_shared_one() {
    let store = Rc::new(MemoryStore::new());
    demoted_by_another_while_its_owner_is_closed(&store, |owner| {
        forge_ok(owner, "slugify", SLUGIFY_V2_JS, "s2");
        use_n(owner, "slugify", 3, "s2");
        assert_eq!(block_on(owner.registry.request_promotion("slugify", Tier::Agent, "s2")).unwrap().status, PromotionStatus::Promoted);
    });
    let reopened = rig_for("agent1", promo_config(), Some(approving_judge()), None, store);
    let recorded = demotions(&reopened);
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0].0, Some(1));
    assert!(recorded[0].2.contains("another agent (`agent2`) took it out of the shared tier; this agent's tier keeps its own v2"), "{}", recorded[0].2);
}

#[test]
fn a_demotion_notice_whose_audit_write_was_refused_at_load_is_audited_once_whichever_write_lands() {
    let memory = Rc::new(MemoryStore::new());
    demoted_by_another_while_its_owner_is_closed(&memory, |_| {});
    let store = Rc::new(SharedDataStore::new(memory.clone()));
    let load = || rig_over("agent1", promo_config(), Some(approving_judge()), None, memory.clone(), store.clone());
    // Refused and closed before another write: neither the entry nor the clearing landed.
    store.refuse_writes.set(true);
    let refused = load();
    assert_eq!(demotions(&refused).len(), 1, "memory shows it all the same");
    refused.registry.close();
    store.refuse_writes.set(false);
    // Refused again, then carried by the next write that goes through (a forge's).
    store.refuse_writes.set(true);
    let carried = load();
    store.refuse_writes.set(false);
    forge_ok(&carried, "other_tool", SLUGIFY_JS, "s3");
    assert_eq!(demotions(&carried).len(), 1);
    carried.registry.close();
    let recorded = demotions(&load());
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert!(recorded[0].2.contains("`agent2`"), "{}", recorded[0].2);
    assert!(block_on(memory.get("agent/agent1/demotion-notice/slugify")).unwrap().is_none(), "cleared");
}

#[test]
fn a_shared_tier_reload_with_no_demotion_to_record_writes_nothing() {
    let memory = Rc::new(MemoryStore::new());
    let store = Rc::new(SharedDataStore::new(memory.clone()));
    let r = rig_over("agent1", promo_config(), Some(approving_judge()), None, memory, store.clone());
    store.refuse_writes.set(true);
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1"); // its audit entries are left for a later write
    store.refuse_writes.set(false);
    store.log.borrow_mut().clear();
    // Every change a sibling makes reloads the others: not one write each.
    block_on(r.registry.reload_shared()).unwrap();
    assert!(!store.log.borrow().contains(&"batch".to_string()), "{:?}", store.log.borrow());
}

#[test]
fn a_reload_after_another_agent_demoted_the_shared_tool_keeps_the_owners_newer_agent_tier_version_and_its_calls() {
    let store = Rc::new(MemoryStore::new());
    let config = EmergentConfig { stats_flush_every: 1000, ..promo_config() };
    let owner = rig_for("agent1", config.clone(), Some(approving_judge()), Some(approving_judge()), store.clone());
    forge_ok(&owner, "slugify", SLUGIFY_JS, "s1");
    use_n(&owner, "slugify", 3, "s1");
    assert_eq!(block_on(owner.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
    let approval = block_on(owner.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    block_on(owner.registry.approve(&approval.id)).unwrap();
    // A newer version of the owner's own at its agent tier, with calls not written yet.
    forge_ok(&owner, "slugify", SLUGIFY_V2_JS, "s2");
    use_n(&owner, "slugify", 3, "s2");
    assert_eq!(block_on(owner.registry.request_promotion("slugify", Tier::Agent, "s2")).unwrap().status, PromotionStatus::Promoted);
    use_n(&owner, "slugify", 5, "s2");
    let agent_tier = |r: &Rig| r.registry.list("s2").into_iter().find(|t| t.tier == Tier::Agent).map(|t| (t.version, t.stats.calls));
    assert_eq!(agent_tier(&owner), Some((2, 8)));
    let other = rig_for("agent2", config, Some(approving_judge()), None, store.clone());
    block_on(other.registry.demote("slugify", "z")).unwrap();
    block_on(owner.registry.reload_shared()).unwrap();
    assert_eq!(agent_tier(&owner), Some((2, 8)), "not replaced by the stored copy");
    assert!(owner.registry.audit_trail().iter().any(|a| a.action == "demote" && a.version == Some(1) && a.detail.contains("keeps its own v2")));
    block_on(owner.registry.flush_stats()).unwrap();
    assert_eq!(block_on(store.get("agent/agent1/stats/slugify")).unwrap().unwrap()["data"]["calls"], 8);
}

#[test]
fn a_demoted_version_rolled_back_to_after_a_new_forge_is_still_not_promoted_by_its_uses() {
    let (r, panel) = auto_promoting_rig_with_slugify();
    use_n(&r, "slugify", 3, "s1");
    let demoted = block_on(r.registry.demote("slugify", "s1")).unwrap();
    forge_ok(&r, "slugify", SLUGIFY_V2_JS, "s1");
    assert_eq!(block_on(r.registry.rollback("slugify", demoted.version, "s1")).unwrap().hash, demoted.hash);
    let asked = panel.requests.borrow().len();
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(panel.requests.borrow().len(), asked, "the panel is not asked");
    assert_eq!(r.registry.list("s1").into_iter().find(|t| t.status == ToolStatus::Active).unwrap().tier, Tier::Session);
}

#[test]
fn every_demoted_version_stays_held_off_not_only_the_last_one_demoted() {
    let (r, panel) = auto_promoting_rig_with_slugify();
    use_n(&r, "slugify", 3, "s1");
    let v1 = block_on(r.registry.demote("slugify", "s1")).unwrap();
    forge_ok(&r, "slugify", SLUGIFY_V2_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(r.registry.list("s1").into_iter().find(|t| t.status == ToolStatus::Active).unwrap().tier, Tier::Agent, "v2 promoted by its uses");
    let v2 = block_on(r.registry.demote("slugify", "s1")).unwrap();
    assert_ne!(v1.hash, v2.hash);
    assert_eq!(block_on(r.registry.rollback("slugify", v1.version, "s1")).unwrap().hash, v1.hash);
    let asked = panel.requests.borrow().len();
    use_n(&r, "slugify", 6, "s1");
    assert_eq!(panel.requests.borrow().len(), asked, "the panel is not asked about v1, demoted before v2 was");
    let active = r.registry.list("s1").into_iter().find(|t| t.status == ToolStatus::Active).unwrap();
    assert_eq!((active.tier, active.version), (Tier::Session, v1.version));
}

#[test]
fn demotions_and_rejected_forges_are_in_the_audit_trail() {
    let r = promoted_rig(Rc::new(MemoryStore::new()));
    block_on(r.registry.demote("slugify", "s2")).unwrap();
    block_on(r.registry.forge(&slugify_request("wrong", WRONG_JS), "s1"));
    let trail = r.registry.audit_trail();
    let demote = trail.iter().find(|a| a.action == "demote").expect("a demote entry");
    assert_eq!((demote.tool.as_str(), demote.tier), ("slugify", Some(Tier::Session)));
    let reject = trail.iter().find(|a| a.action == "reject").expect("a reject entry");
    assert_eq!((reject.tool.as_str(), reject.session_id.as_deref()), ("wrong", Some("s1")));
    assert!(reject.detail.starts_with("other: 2 of 2 tests failed"), "{}", reject.detail);
}

#[test]
fn a_denied_approval_leaves_the_tool_where_it_was() {
    let r = promoted_rig(Rc::new(MemoryStore::new()));
    let approval = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    block_on(r.registry.deny(&approval.id, "not general enough")).unwrap();
    assert!(r.events.bodies().iter().any(|b| matches!(b,
        EventBody::PromotionRejected { name, from_tier: Tier::Agent, to_tier: Tier::Shared, reason } if name == "slugify" && reason.contains("not general enough"))));
    assert!(r.registry.pending_approvals().is_empty());
    assert_eq!(r.registry.list("s1")[0].tier, Tier::Agent);
    assert!(r.registry.audit_trail().iter().any(|a| a.action == "approval.denied" && a.detail.contains("not general enough")));
    assert!(matches!(block_on(r.registry.approve(&approval.id)), Err(RegistryError::NoSuchApproval(_))));
}

#[test]
fn demote_moves_a_tool_down_and_the_old_tier_cannot_be_called() {
    let store = Rc::new(MemoryStore::new());
    let r = promoted_rig(store.clone());
    let info = block_on(r.registry.demote("slugify", "s2")).unwrap();
    assert_eq!(info.tier, Tier::Session);
    assert!(r.events.types().contains(&"tool.demoted".to_string()));
    let err = block_on(r.registry.call_at("slugify", Tier::Agent, json!({ "text": "x" }), "s2")).unwrap_err();
    assert_eq!(err.code, "denied");
    assert!(block_on(r.registry.call_at("slugify", Tier::Session, json!({ "text": "x" }), "s2")).is_ok());
    // Other sessions no longer reach it at all; after a restart the agent tier is still a tombstone.
    assert_eq!(block_on(r.registry.call("slugify", json!({ "text": "x" }), "s3")).unwrap_err().code, "denied");
    let fresh = rig_with(promo_config(), Some(approving_judge()), None, store);
    let listed = fresh.registry.list("s9");
    assert_eq!(listed[0].status, ToolStatus::Demoted);
    assert_eq!(block_on(fresh.registry.call("slugify", json!({ "text": "x" }), "s9")).unwrap_err().code, "denied");
    assert!(matches!(block_on(r.registry.demote("slugify", "s2")), Err(RegistryError::LowestTier(_))));
}

#[test]
fn a_tool_demoted_into_a_session_is_not_promoted_again_by_the_uses_that_follow() {
    let (r, panel) = auto_promoting_rig_with_slugify();
    use_n(&r, "slugify", 3, "s1");
    assert_eq!((r.registry.list("s1")[0].tier, panel.requests.borrow().len()), (Tier::Agent, 2), "promoted by its third use");
    assert_eq!(block_on(r.registry.demote("slugify", "s1")).unwrap().tier, Tier::Session);
    use_n(&r, "slugify", 6, "s1");
    assert_eq!((r.registry.list("s1")[0].tier, panel.requests.borrow().len()), (Tier::Session, 2), "the panel is not asked again");
    // A request still may: the operator's demotion does not bind the operator.
    let out = block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap();
    assert_eq!(out.status, PromotionStatus::Promoted, "{out:?}");
}

#[test]
fn a_rolled_back_version_does_not_inherit_the_uses_of_the_version_it_replaces() {
    let r = rig_with(promo_config(), Some(approving_judge()), Some(approving_judge()), Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    forge_ok(&r, "slugify", SLUGIFY_V2_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    let v1 = block_on(r.registry.rollback("slugify", 1, "s1")).unwrap();
    assert_eq!((v1.version, v1.stats.calls), (1, 0), "the three calls were of version 2");
    let out = block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap();
    assert_eq!(out.status, PromotionStatus::Rejected, "version 1 has no uses of its own: {out:?}");
}

#[test]
fn demoting_into_a_session_keeps_the_sessions_own_newer_version_in_the_history() {
    let r = promoted_rig(Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_V2_JS, "s2");
    let own = r.registry.list("s2").into_iter().find(|t| t.tier == Tier::Session).unwrap();
    assert_eq!(own.version, 2);
    assert_eq!(block_on(r.registry.demote("slugify", "s2")).unwrap().tier, Tier::Session);
    let back = block_on(r.registry.rollback("slugify", 2, "s2")).unwrap();
    assert_eq!((back.version, back.hash), (2, own.hash), "the session's own v2 can be rolled back to");
    forge_ok(&r, "slugify", SLUGIFY_JS, "s2");
    let next = r.registry.list("s2").into_iter().find(|t| t.tier == Tier::Session).unwrap();
    assert_eq!(next.version, 3, "a later forge is numbered after it, not as a second v2");
}

#[test]
fn versions_are_numbered_across_sessions_so_one_number_is_one_content() {
    let r = promoted_rig(Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_V2_JS, "s2");
    forge_ok(&r, "slugify", ADD_JS.replace("ADD", "SLUGIFY").as_str(), "s3");
    let version_in = |session: &str| r.registry.list(session).into_iter().find(|t| t.tier == Tier::Session).map(|t| t.version);
    assert_eq!((version_in("s2"), version_in("s3")), (Some(2), Some(3)), "the second session's is v3, not a second v2");
}

#[test]
fn versions_carry_hashes_and_rollback_restores_one() {
    let r = rig();
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    forge_ok(&r, "slugify", SLUGIFY_V2_JS, "s1");
    let v2 = r.registry.list("s1").pop().unwrap();
    assert_eq!((v2.version, v2.versions.clone()), (2, vec![1, 2]));
    let v1 = block_on(r.registry.rollback("slugify", 1, "s1")).unwrap();
    assert_eq!(v1.version, 1);
    assert_ne!(v1.hash, v2.hash);
    let Some(crucible::forge::Implementation::Sandbox { code, .. }) = &v1.implementation else { panic!() };
    assert_eq!(code.as_deref(), Some(SLUGIFY_JS));
    assert!(matches!(block_on(r.registry.rollback("slugify", 9, "s1")), Err(RegistryError::NoSuchVersion { .. })));
    assert!(r.registry.audit_trail().iter().any(|a| a.action == "rollback"));
}

#[test]
fn the_audit_trail_is_a_bounded_ring() {
    let r = rig_with(EmergentConfig { audit_capacity: 5, ..Default::default() }, Some(approving_judge()), None, Rc::new(MemoryStore::new()));
    for i in 0..4 {
        forge_ok(&r, &format!("t{i}"), SLUGIFY_JS, "s1");
    }
    let trail = r.registry.audit_trail();
    assert_eq!(trail.len(), 5);
    assert_eq!(trail.last().unwrap().action, "register");
    assert_eq!(trail.last().unwrap().tool, "t3");
    // One key per entry; the entries dropped from the ring are deleted from the store too.
    let persisted = block_on(r.store.scan("agent/agent1/audit/")).unwrap();
    assert_eq!(persisted.len(), 5);
    assert_eq!(persisted.last().unwrap().1["data"]["tool"], "t3");
    let reloaded = rig_with(EmergentConfig { audit_capacity: 5, ..Default::default() }, Some(approving_judge()), None, r.store.clone());
    assert_eq!(reloaded.registry.audit_trail(), trail);
    let actions: Vec<String> = rig_audit_actions();
    assert_eq!(actions, ["forge", "verdict", "register"]);
    // Opened with a smaller ring (or over entries a refused delete left), it keeps its bound
    // from the start: the newest entries, the others deleted from the store too.
    let smaller = rig_with(EmergentConfig { audit_capacity: 2, ..Default::default() }, Some(approving_judge()), None, r.store.clone());
    assert_eq!(smaller.registry.audit_trail(), trail[3..]);
    assert_eq!(block_on(r.store.scan("agent/agent1/audit/")).unwrap().len(), 2);
}

#[test]
fn an_audit_ring_stored_in_the_old_single_key_format_is_read_and_migrated() {
    let store = Rc::new(MemoryStore::new());
    let old = |tool: &str| json!({ "at": 1.0, "action": "forge", "tool": tool, "detail": "hash x" });
    block_on(store.put("agent/agent1/audit", json!({ "kind": "audit", "v": 1, "data": [old("a"), old("b")] }))).unwrap();
    let r = rig_with(EmergentConfig::default(), Some(approving_judge()), None, store.clone());
    forge_ok(&r, "c", SLUGIFY_JS, "s1");
    let tools: Vec<String> = r.registry.audit_trail().into_iter().map(|a| a.tool).collect();
    assert_eq!(tools, ["a", "b", "c", "c", "c"]);
    assert!(block_on(store.get("agent/agent1/audit")).unwrap().is_none(), "the old key is replaced");
    let again = rig_with(EmergentConfig::default(), Some(approving_judge()), None, store);
    assert_eq!(again.registry.audit_trail().len(), 5);
}

#[test]
fn a_legacy_audit_ring_migrated_beside_newer_per_entry_records_goes_before_them_and_replaces_none() {
    let store = Rc::new(MemoryStore::new());
    let entry = |tool: &str| json!({ "at": 1.0, "action": "forge", "tool": tool, "detail": "hash x" });
    for (seq, tool) in ["new0", "new1", "new2"].into_iter().enumerate() {
        block_on(store.put(&format!("agent/agent1/audit/{seq:012}"), json!({ "kind": "audit-entry", "v": 1, "data": entry(tool) }))).unwrap();
    }
    block_on(store.put("agent/agent1/audit", json!({ "kind": "audit", "v": 1, "data": [entry("old0"), entry("old1")] }))).unwrap();
    let tools = |r: &Rig| r.registry.audit_trail().into_iter().map(|a| a.tool).collect::<Vec<_>>();
    let r = rig_with(EmergentConfig::default(), Some(approving_judge()), None, store.clone());
    assert_eq!(tools(&r), ["old0", "old1", "new0", "new1", "new2"]);
    let reopened = rig_with(EmergentConfig::default(), Some(approving_judge()), None, store.clone());
    assert_eq!(tools(&reopened), ["old0", "old1", "new0", "new1", "new2"], "the store holds every entry, oldest first");
    forge_ok(&reopened, "c", SLUGIFY_JS, "s1");
    let again = rig_with(EmergentConfig::default(), Some(approving_judge()), None, store);
    assert_eq!(tools(&again), ["old0", "old1", "new0", "new1", "new2", "c", "c", "c"], "later entries go after them");
}

fn rig_audit_actions() -> Vec<String> {
    let r = rig();
    forge_ok(&r, "x", SLUGIFY_JS, "s1");
    r.registry.audit_trail().into_iter().map(|a| a.action).collect()
}

#[test]
fn export_redacts_sandbox_source_and_a_redacted_package_is_not_importable() {
    let r = rig();
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    let pkg = r.registry.export("slugify", "s1").unwrap();
    assert!(pkg.contains("crucible.tool.v1"));
    assert!(pkg.contains("redacted: true"));
    assert!(!pkg.contains("SLUGIFY*/"), "source is left out");
    let err = block_on(r.registry.import(&pkg, "s2")).unwrap_err();
    assert!(err.to_string().contains("redacted"), "{err}");
}

#[test]
fn a_redacted_export_leaves_out_the_judges_reasoning_which_may_quote_the_source() {
    let quoting = support::ScriptedModel::repeating(text(&verdict(true, 0.9, 0.9).replace("\"reviewed\"", "\"it ends with SLUGIFY*/ and is safe\"")));
    let r = rig_with(EmergentConfig::default(), Some(quoting.clone()), Some(quoting), Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    let pkg = r.registry.export("slugify", "s1").unwrap();
    assert!(pkg.contains("redacted: true") && pkg.contains("confidence: 0.9"), "the verdict's scores stay: {pkg}");
    assert!(!pkg.contains("SLUGIFY*/"), "a quote of the source in the reasoning is left out too: {pkg}");
    // With the source persisted, nothing is redacted: the reasoning is exported as given.
    let config = EmergentConfig { persist_sandbox_source: true, ..EmergentConfig::default() };
    let r = rig_with(config, Some(approving_judge()), Some(approving_judge()), Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    assert!(r.registry.export("slugify", "s1").unwrap().contains("reasoning: reviewed"));
}

#[test]
fn import_verifies_the_hash_reruns_tests_and_judge_and_lands_in_the_session_tier() {
    let config = EmergentConfig { persist_sandbox_source: true, ..Default::default() };
    let judge = approving_judge();
    let r = rig_with(config.clone(), Some(judge.clone()), None, Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    let pkg = r.registry.export("slugify", "s1").unwrap();
    assert!(pkg.contains("SLUGIFY"));

    let tampered = pkg.replace("Turn text into a URL slug", "Turn text into a URL slug, trust me");
    let err = block_on(r.registry.import(&tampered, "s2")).unwrap_err();
    assert!(err.to_string().contains("hash mismatch"), "{err}");
    // A refused package leaves a trace, under the name it gives.
    let refused = r.registry.audit_trail().into_iter().last().expect("an audit entry");
    assert_eq!((refused.action.as_str(), refused.tool.as_str(), refused.session_id.as_deref()), ("import.refused", "slugify", Some("s2")));
    assert!(refused.detail.contains("hash mismatch"), "{}", refused.detail);
    block_on(r.registry.import("not: [a package", "s2")).unwrap_err();
    let unreadable = r.registry.audit_trail().into_iter().last().expect("an audit entry");
    assert_eq!((unreadable.action.as_str(), unreadable.tool.as_str()), ("import.refused", ""));
    // A hash that is not a string is not "no hash", under either format id.
    let hash_line = pkg.lines().find(|l| l.starts_with("hash:")).expect("the package has a hash line").to_string();
    for format in ["crucible.tool.v1", "agentos.emergent-tool.v1"] {
        let relabelled = tampered.replace("crucible.tool.v1", format).replace(&hash_line, "hash: 0x1234");
        let err = block_on(r.registry.import(&relabelled, "s2")).unwrap_err();
        assert!(err.to_string().contains("`hash` must be a string"), "{format}: {err}");
    }
    // The prefix is read whatever its case.
    let digest = hash_line.trim_start_matches("hash:").trim().trim_matches('"').trim_start_matches("sha256:").to_string();
    let prefixed = pkg.replace(&hash_line, &format!("hash: SHA256:{digest}"));
    assert!(block_on(r.registry.import(&prefixed, "s3")).unwrap().success);

    let other = rig_with(config, Some(approving_judge()), None, Rc::new(MemoryStore::new()));
    let res = block_on(other.registry.import(&pkg, "s7")).unwrap();
    assert!(res.success, "{res:?}");
    assert_eq!(res.tool.as_ref().unwrap().tier, Tier::Session);
    assert_eq!(res.tests.as_ref().unwrap().len(), 2, "tests re-run");
    assert_eq!(other.sandbox.requests.borrow().len(), 2);
    assert!(other.events.types().contains(&"forge.judge".to_string()), "judge re-asked");
    assert!(other.registry.audit_trail().iter().any(|a| a.action == "import"));
    assert_eq!(block_on(other.registry.call("slugify", json!({ "text": "A B" }), "s7")).unwrap(), json!({ "slug": "a-b" }));

    // A package its importer's judge refuses is told apart from a refused forge in the trail.
    let doubting = rig_with(
        EmergentConfig { persist_sandbox_source: true, ..Default::default() },
        Some(judge_replying(vec![text(&verdict(false, 0.2, 0.9))])),
        None,
        Rc::new(MemoryStore::new()),
    );
    assert!(!block_on(doubting.registry.import(&pkg, "s1")).unwrap().success);
    let actions: Vec<String> = doubting.registry.audit_trail().into_iter().map(|a| a.action).collect();
    assert!(actions.contains(&"import.rejected".to_string()) && !actions.contains(&"reject".to_string()), "{actions:?}");
}

#[test]
fn an_imported_tool_keeps_where_its_package_says_it_came_from() {
    let config = EmergentConfig { persist_sandbox_source: true, ..Default::default() };
    let memory = Rc::new(MemoryStore::new());
    let maker = rig_of_models("maker", config.clone(), Some(approving_judge()), None, memory.clone(), memory);
    forge_ok(&maker, "slugify", SLUGIFY_JS, "s1");
    let pkg = maker.registry.export("slugify", "s1").unwrap();
    assert!(!pkg.contains("importedFrom"), "a forged tool was imported from nowhere: {pkg}");
    let memory = Rc::new(MemoryStore::new());
    let taker = rig_of_models("taker", config, Some(approving_judge()), None, memory.clone(), memory);
    assert!(block_on(taker.registry.import(&pkg, "s9")).unwrap().success);
    let import = taker.registry.audit_trail().into_iter().find(|a| a.action == "import").expect("the import is audited");
    assert!(import.detail.contains("the package says it came from agent `maker`, session `s1`, session tier, v1"), "{}", import.detail);
    // Exported again, the package tells both: who holds the tool now, and where they got it.
    let again = taker.registry.export("slugify", "s9").unwrap();
    assert!(again.contains("agentId: taker") && again.contains("importedFrom: agent `maker`, session `s1`, session tier, v1"), "{again}");
    // An agentos package says it with its own fields.
    let pkg = agentos_package("  name: slug4\n  description: slug\n  inputSchema:\n    type: object\n    properties:\n      text: { type: string }\n  outputSchema:\n    type: object\n    properties:\n      slug: { type: string }\n  implementation:\n    mode: sandbox\n    sourcePersisted: true\n    redactedAtRest: false\n    code: CODE\n  createdBy: gmi-42\n  originalTier: agent\n  source: \"forged in a\\nsupport session\"\n  tests:\n    - input: { text: Hello World }\n      expected: { slug: hello-world }\n    - input: { text: a b }\n      expected: { slug: a-b }\n");
    assert!(block_on(taker.registry.import(&pkg, "s9")).unwrap().success);
    let import = taker.registry.audit_trail().into_iter().rfind(|a| a.action == "import").expect("the import is audited");
    assert!(import.detail.ends_with("came from agent `gmi-42`, agent tier, “forged in a support session”"), "{}", import.detail);
}

#[test]
fn a_tool_imported_twice_keeps_where_it_came_from_first() {
    let config = EmergentConfig { persist_sandbox_source: true, ..Default::default() };
    let rig = |agent: &str| {
        let memory = Rc::new(MemoryStore::new());
        rig_of_models(agent, config.clone(), Some(approving_judge()), None, memory.clone(), memory)
    };
    let maker = rig("maker");
    forge_ok(&maker, "slugify", SLUGIFY_JS, "s1");
    let taker = rig("taker");
    assert!(block_on(taker.registry.import(&maker.registry.export("slugify", "s1").unwrap(), "s9")).unwrap().success);
    let third = rig("third");
    assert!(block_on(third.registry.import(&taker.registry.export("slugify", "s9").unwrap(), "s3")).unwrap().success);
    let import = third.registry.audit_trail().into_iter().find(|a| a.action == "import").expect("the import is audited");
    // The second package says who held the tool, and where they had it from: both stay.
    assert!(
        import.detail.contains("came from agent `taker`, session `s9`, session tier, v1, imported from agent `maker`, session `s1`, session tier, v1"),
        "{}",
        import.detail
    );
    assert!(third.registry.export("slugify", "s3").unwrap().contains("imported from agent `maker`"), "exported again, the origin goes on");
}

/// An `agentos.emergent-tool.v1` package whose `tool` mapping is `tool_yaml` (indented two
/// spaces), with the slugify source where it says `CODE`.
fn agentos_package(tool_yaml: &str) -> String {
    let code = format!("\"{}\"", SLUGIFY_JS.replace('\\', "\\\\").replace('"', "\\\""));
    format!("schemaVersion: agentos.emergent-tool.v1\npackageType: emergent-tool\ntool:\n{}", tool_yaml.replace("CODE", &code))
}

#[test]
fn import_reads_the_agentos_shape_where_fields_match() {
    let r = rig();
    // snake_case keys and test cases under `tests` with `expected`.
    let pkg = agentos_package("  name: slug2\n  description: slug\n  input_schema:\n    type: object\n    properties:\n      text: { type: string }\n  output_schema:\n    type: object\n    properties:\n      slug: { type: string }\n  implementation:\n    mode: sandbox\n    code: CODE\n  tests:\n    - input: { text: Hello World }\n      expected: { slug: hello-world }\n    - input: { text: a b }\n      expected: { slug: a-b }\n");
    let res = block_on(r.registry.import(&pkg, "s1")).unwrap();
    assert!(res.success, "{res:?}");
    assert!(block_on(r.registry.import("format: something.else\nname: x\n", "s1")).is_err());
}

#[test]
fn an_agentos_package_without_test_cases_imports_with_the_importers_and_not_without() {
    let r = rig();
    // The shape @framers/agentos writes: no test cases, portability metadata, camelCase.
    let pkg = agentos_package("  name: slug3\n  description: slug\n  inputSchema:\n    type: object\n    properties:\n      text: { type: string }\n  outputSchema:\n    type: object\n    properties:\n      slug: { type: string }\n  implementation:\n    mode: sandbox\n    allowlist: []\n    sourcePersisted: true\n    redactedAtRest: false\n    code: CODE\n  judgeVerdicts: []\n");
    let err = block_on(r.registry.import(&pkg, "s1")).unwrap_err();
    assert!(matches!(&err, RegistryError::InvalidPackage(m) if m.contains("no test cases")), "{err}");
    let options = ImportOptions { test_cases: serde_json::from_value(json!([{ "input": { "text": "Hello World" }, "expectedOutput": { "slug": "hello-world" } }, { "input": { "text": "a b" }, "expectedOutput": { "slug": "a-b" } }])).unwrap() };
    let res = block_on(r.registry.import_with(&pkg, "s1", &options)).unwrap();
    assert!(res.success, "{res:?}");
    assert_eq!(res.tests.map(|t| t.len()), Some(2), "the supplied cases ran");
    // A package with cases of its own keeps them: the importer's are refused, not dropped unseen.
    let with_cases = pkg.replace(
        "  judgeVerdicts: []\n",
        "  judgeVerdicts: []\n  tests:\n    - input: { text: x y }\n      expected: { slug: x-y }\n    - input: { text: z }\n      expected: { slug: z }\n",
    );
    let err = block_on(r.registry.import_with(&with_cases, "s4", &options)).unwrap_err();
    assert!(matches!(&err, RegistryError::InvalidPackage(m) if m.contains("carries its own test cases")), "{err}");
    assert!(block_on(r.registry.import(&with_cases, "s4")).unwrap().success);
    // An empty list in the package carries no cases either; the importer's are read as a
    // request's are (`expected` for `expectedOutput`), so a wrong one fails the import.
    let empty = pkg.replace("  judgeVerdicts: []\n", "  judgeVerdicts: []\n  testCases: []\n");
    let wrong = ImportOptions {
        test_cases: vec![
            json!({ "input": { "text": "a b" }, "expected": { "slug": "WRONG" } }),
            json!({ "input": { "text": "c" }, "expected": { "slug": "c" } }),
        ],
    };
    let res = block_on(r.registry.import_with(&empty, "s3", &wrong)).unwrap();
    assert!(!res.success && res.reason.as_deref().is_some_and(|m| m.contains("WRONG")), "{res:?}");
    let redacted = pkg.replace("sourcePersisted: true", "sourcePersisted: false");
    let err = block_on(r.registry.import_with(&redacted, "s2", &options)).unwrap_err();
    assert!(matches!(&err, RegistryError::InvalidPackage(m) if m.contains("redacted")), "{err}");
}

/// U+0085, U+2028 and U+2029 are text to the YAML 1.2 and JSON that peers write (agentos writes
/// them raw), but line breaks to a YAML 1.1 reader, which would fold them and the spaces around
/// them away: an agentos JSON package keeps them, and a YAML one holding them raw is refused, not
/// changed.
#[test]
fn raw_unicode_line_separators_in_a_package_are_kept_or_refused_never_silently_changed() {
    let config = EmergentConfig { persist_sandbox_source: true, ..Default::default() };
    let r = rig_with(config, Some(approving_judge()), None, Rc::new(MemoryStore::new()));
    let code = format!("{SLUGIFY_JS} // a \u{2028} b \u{85} c \u{2029} d");
    let description = "Slugs \u{2028} text \u{85} too";
    let tool = json!({
        "name": "slug_ls", "description": description,
        "inputSchema": { "type": "object", "properties": { "text": { "type": "string" } }, "required": ["text"] },
        "outputSchema": { "type": "object", "properties": { "slug": { "type": "string" } }, "required": ["slug"] },
        "implementation": { "mode": "sandbox", "allowlist": [], "sourcePersisted": true, "redactedAtRest": false, "code": code },
        "tests": [{ "input": { "text": "Hello World" }, "expected": { "slug": "hello-world" } }, { "input": { "text": "a b" }, "expected": { "slug": "a-b" } }],
    });
    // agentos writes JSON with JSON.stringify, which leaves these characters raw.
    let package = json!({ "schemaVersion": "agentos.emergent-tool.v1", "packageType": "emergent-tool", "tool": tool });
    for text in [serde_json::to_string(&package).unwrap(), serde_json::to_string_pretty(&package).unwrap()] {
        assert!(text.contains('\u{2028}') && text.contains('\u{85}'), "the characters are raw in the package");
        let res = block_on(r.registry.import(&text, "s1")).unwrap();
        assert!(res.success, "{res:?}");
        let imported = res.tool.unwrap();
        assert_eq!(imported.description, description);
        assert_eq!(r.sandbox.requests.borrow().last().unwrap().code, code, "the code runs as written");
    }
    // Written raw in YAML, a YAML 1.1 reader would change them: refused, saying which and where.
    let yaml = format!(
        "schemaVersion: agentos.emergent-tool.v1\ntool:\n  name: slug_ls\n  description: \"Slugs \u{2028} text\"\n  code: \"{}\"\n",
        SLUGIFY_JS.replace('\\', "\\\\")
    );
    let err = block_on(r.registry.import(&yaml, "s2")).unwrap_err();
    assert!(matches!(&err, RegistryError::InvalidPackage(m) if m.contains("U+2028") && m.contains("line 4")), "{err}");
    // This crate's own packages read them back as written (its emitter writes some raw, in
    // single quotes: see the YAML round trip in fuzz_no_panic), and carry a hash that would tell.
    let mut request = slugify_request("slug_own", &code);
    request["description"] = json!(description);
    assert!(block_on(r.registry.forge(&request, "s3")).success);
    let own = r.registry.export("slug_own", "s3").unwrap();
    let again = block_on(r.registry.import(&own, "s4")).unwrap();
    assert_eq!(again.tool.map(|t| t.description), Some(description.to_string()));
}

/// `JSON.stringify` writes a lone surrogate (a description cut inside an emoji with `slice`) as
/// a `\udXXX` escape, which serde_json alone refuses: a JSON package holding one imports with
/// U+FFFD in its place, as the rest of the runtime reads such text.
#[test]
fn a_json_package_with_a_lone_surrogate_escape_imports_with_a_replacement_character() {
    let r = rig_with(EmergentConfig { persist_sandbox_source: true, ..Default::default() }, Some(approving_judge()), None, Rc::new(MemoryStore::new()));
    let tool = json!({
        "name": "slug_cut", "description": "Slugs text MARK",
        "inputSchema": { "type": "object", "properties": { "text": { "type": "string" } }, "required": ["text"] },
        "outputSchema": { "type": "object", "properties": { "slug": { "type": "string" } }, "required": ["slug"] },
        "implementation": { "mode": "sandbox", "allowlist": [], "sourcePersisted": true, "redactedAtRest": false, "code": SLUGIFY_JS },
        "tests": [{ "input": { "text": "Hello World" }, "expected": { "slug": "hello-world" } }, { "input": { "text": "a b" }, "expected": { "slug": "a-b" } }],
    });
    let package = json!({ "schemaVersion": "agentos.emergent-tool.v1", "packageType": "emergent-tool", "tool": tool });
    let text = serde_json::to_string(&package).unwrap().replace("MARK", "\\ud83c");
    let res = block_on(r.registry.import(&text, "s1")).unwrap();
    assert!(res.success, "{res:?}");
    assert_eq!(res.tool.unwrap().description, "Slugs text \u{fffd}");
}

#[test]
fn import_reads_aliases_within_a_budget_and_refuses_a_package_that_expands_past_it() {
    let r = rig();
    // The `yaml` package agentos writes with makes an anchor and alias of a repeated object.
    let schema = "&text\n    type: object\n    properties:\n      text: { type: string }";
    let pkg = agentos_package(&format!("  name: slug4\n  description: slug\n  inputSchema: {schema}\n  outputSchema:\n    type: object\n    properties:\n      slug: {{ type: string }}\n  implementation:\n    mode: sandbox\n    code: CODE\n  tests:\n    - input: {{ text: Hello World }}\n      expected: {{ slug: hello-world }}\n    - input: {{ text: a b }}\n      expected: {{ slug: a-b }}\n"));
    let res = block_on(r.registry.import(&pkg, "s1")).unwrap();
    assert!(res.success, "{res:?}");

    // 10 KB of text whose aliases of aliases would expand to 50 MB ("billion laughs").
    let laughs =
        format!("format: crucible.tool.v1\na: &a \"{}\"\nl1: &l1 [{}]\nl2: [{}]\n", "x".repeat(10_000), vec!["*a"; 100].join(", "), vec!["*l1"; 50].join(", "));
    let started = std::time::Instant::now();
    let err = block_on(r.registry.import(&laughs, "s1")).unwrap_err();
    assert!(matches!(&err, RegistryError::InvalidPackage(m) if m.contains(&format!("expands to more than {MAX_EXPANDED_BYTES} bytes"))), "{err}");
    assert!(started.elapsed().as_secs() < 5, "stopped early, not after building it");
    // Aliases of empty collections: a few bytes of JSON each, but a node in memory each.
    let empties = format!("format: crucible.tool.v1\nseed: &a [{}]\njunk: [{}]\n", vec!["[]"; 1000].join(", "), vec!["*a"; 8000].join(", "));
    let err = block_on(r.registry.import(&empties, "s1")).unwrap_err();
    assert!(matches!(&err, RegistryError::InvalidPackage(m) if m.contains("expands to more than")), "{err}");

    // Flow collections opened deep: the YAML reader's own limit refuses them only after a scan
    // whose cost grows with the square of their number. Quoted closes or closes in comments
    // close nothing, so they cannot hide the depth.
    let half = MAX_PACKAGE_BYTES / 2 - 64;
    for deep in [
        format!("format: crucible.tool.v1\nspec: {}{}\n", "[".repeat(half), "]".repeat(half)),
        format!("format: crucible.tool.v1\nspec: {}\n", "[\"]\",".repeat(MAX_PACKAGE_BYTES / 6)),
        format!("format: crucible.tool.v1\nspec: {}", "[ #]\n".repeat(MAX_PACKAGE_BYTES / 6)),
        format!("format: crucible.tool.v1\nspec: {}\n", "{a: ".repeat(MAX_PACKAGE_BYTES / 5)),
    ] {
        let started = std::time::Instant::now();
        let err = block_on(r.registry.import(&deep, "s1")).unwrap_err();
        let expected = format!("nests flow collections ([…], {{…}}) more than {MAX_FLOW_NESTING} deep");
        assert!(matches!(&err, RegistryError::InvalidPackage(m) if m.contains(&expected)), "{}: {err}", &deep[..40]);
        assert!(started.elapsed().as_millis() < 1500, "{}: refused before the YAML reader scans it", &deep[..40]);
    }
    // Brackets in strings and code are no collections: a tool whose test input is 1,100
    // opening brackets exports and imports again.
    let config = EmergentConfig { persist_sandbox_source: true, ..Default::default() };
    let keeper = rig_with(config, Some(approving_judge()), None, Rc::new(MemoryStore::new()));
    let mut request = slugify_request("bracketed", &format!("/*SLUGIFY*/ function execute(input) {{ return {{ slug: '{}' }}; }}", "[".repeat(1100)));
    request["testCases"][0] = json!({ "input": { "text": format!("{} A", "[".repeat(1100)) }, "expectedOutput": { "slug": "a" } });
    assert!(block_on(keeper.registry.forge(&request, "s1")).success);
    let package = keeper.registry.export("bracketed", "s1").unwrap();
    assert!(package.matches('[').count() >= 2200, "the brackets are in the package");
    let imported = block_on(keeper.registry.import(&package, "s2")).unwrap();
    assert!(imported.success, "{imported:?}");

    let huge = format!("format: crucible.tool.v1\ndescription: \"{}\"\n", "d".repeat(MAX_PACKAGE_BYTES));
    let err = block_on(r.registry.import(&huge, "s1")).unwrap_err();
    assert!(matches!(&err, RegistryError::InvalidPackage(m) if m.contains("at most 2097152")), "{err}");
}

/// A rig keeping sandbox source in its packages, with `slugify` forged in `s1`, and its package.
fn exported_slugify() -> (Rig, String) {
    let config = EmergentConfig { persist_sandbox_source: true, ..Default::default() };
    let r = rig_with(config, Some(approving_judge()), None, Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    let yaml = r.registry.export("slugify", "s1").unwrap();
    (r, yaml)
}

#[test]
fn a_package_giving_a_key_twice_at_any_level_is_refused_naming_the_key() {
    let (r, yaml) = exported_slugify();
    let code_line = yaml.lines().find(|l| l.starts_with("  code: ")).expect("the package holds the code").to_string();
    let description_line = yaml.lines().find(|l| l.starts_with("description: ")).unwrap().to_string();
    // A reader sees the first `code`, the parser would keep the second.
    let twice_nested = yaml.replace(&code_line, &format!("{code_line}\n  code: \"function execute(input) {{ return {{ slug: 'x' }}; }}\""));
    let twice_top = yaml.replace(&description_line, &format!("{description_line}\ndescription: other"));
    let twice_deep = yaml.replacen("      type: string\n", "      type: string\n      type: number\n", 1);
    assert_ne!(twice_deep, yaml, "the package declares a string property: {yaml}");
    let json_text = serde_json::to_string(&serde_norway::from_str::<serde_json::Value>(&yaml).unwrap()).unwrap();
    let json_twice = json_text.replacen("\"mode\":\"sandbox\"", "\"mode\":\"sandbox\",\"mode\":\"compose\"", 1);
    assert_ne!(json_twice, json_text, "the JSON package has an implementation mode");
    for (package, key) in [(&twice_nested, "code"), (&twice_top, "description"), (&twice_deep, "type"), (&json_twice, "mode")] {
        let err = block_on(r.registry.import(package, "s2")).unwrap_err();
        assert!(
            matches!(&err, RegistryError::InvalidPackage(m) if m.contains(&format!("gives twice the key `{key}`")) && !m.contains("not YAML")),
            "{key}: {err}"
        );
    }
    // Unchanged, both forms import.
    assert!(block_on(r.registry.import(&yaml, "s3")).unwrap().success);
    assert!(block_on(r.registry.import(&json_text, "s4")).unwrap().success);
}

#[test]
fn a_package_starting_with_a_byte_order_mark_imports() {
    let (r, yaml) = exported_slugify();
    let json_text = serde_json::to_string(&serde_norway::from_str::<serde_json::Value>(&yaml).unwrap()).unwrap();
    for (package, session) in [(format!("\u{FEFF}{yaml}"), "s2"), (format!("\u{FEFF}{json_text}"), "s3")] {
        let res = block_on(r.registry.import(&package, session)).unwrap();
        assert!(res.success, "{res:?}");
    }
    // One mark only: a second is text where a key should be.
    assert!(block_on(r.registry.import(&format!("\u{FEFF}\u{FEFF}{yaml}"), "s4")).is_err());
}

#[test]
fn forge_statistics_survive_a_fresh_load_on_the_same_store() {
    let store = Rc::new(MemoryStore::new());
    let r = rig_with(EmergentConfig::default(), Some(approving_judge()), Some(approving_judge()), store.clone());
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    let rejected = block_on(r.registry.forge(&json!({ "name": "bad" }), "s1"));
    assert!(!rejected.success);
    let before = r.registry.stats();
    assert_eq!((before.attempts, before.approved, before.rejected), (2, 1, 1));
    let again = rig_with(EmergentConfig::default(), Some(approving_judge()), Some(approving_judge()), store.clone());
    assert_eq!(again.registry.stats(), before);
    assert_eq!((before.unique_names, before.unique_approved, before.unique_terminal_rejections), (2, 1, 1));
    // Each name is written once, not the whole set with every forge.
    assert_eq!(block_on(store.scan("agent/agent1/forge-name/")).unwrap().len(), 2);
}

/// A store holding forge stats as builds before per-name records wrote them: the name sets
/// inside the forge-stats record (names `a` and `b`, `a` approved).
fn store_with_old_forge_stats() -> Rc<MemoryStore> {
    let store = Rc::new(MemoryStore::new());
    let old = json!({ "attempts": 3, "approved": 1, "rejected": 2, "approved_confidence_sum": 0.9,
        "names": ["a", "b"], "approved_names": ["a"], "histogram": { "shape_check": 2 } });
    block_on(store.put("agent/agent1/forge-stats", json!({ "kind": "forge-stats", "v": 1, "data": old }))).unwrap();
    store
}

#[test]
fn forge_statistics_in_the_old_format_with_name_sets_are_read() {
    let store = store_with_old_forge_stats();
    let r = rig_with(EmergentConfig::default(), Some(approving_judge()), None, store);
    let s = r.registry.stats();
    assert_eq!((s.attempts, s.unique_names, s.unique_approved, s.unique_terminal_rejections), (3, 2, 1, 1));
    assert_eq!(s.rejections_by_category["shape_check"], 2);
}

#[test]
fn forge_statistics_in_the_old_format_keep_their_names_after_the_next_forge_and_a_restart() {
    // The old record carried the name sets; the current build writes counters only, with each
    // name in a record of its own. Names read from the old record must not vanish once the
    // counters are written again.
    let store = store_with_old_forge_stats();
    let r = rig_with(EmergentConfig::default(), Some(approving_judge()), None, store.clone());
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    let before = r.registry.stats();
    assert_eq!((before.attempts, before.unique_names, before.unique_approved, before.unique_terminal_rejections), (4, 3, 2, 1));
    let restarted = rig_with(EmergentConfig::default(), Some(approving_judge()), None, store);
    assert_eq!(restarted.registry.stats(), before);
}

#[test]
fn records_of_a_newer_version_or_another_kind_are_refused_not_read_half_right() {
    use crucible::agent::NativeEnvironment;
    use crucible::registry::{Judges, Registry, RegistryDeps};
    let load = |key: &str, record: serde_json::Value| {
        let store = Rc::new(MemoryStore::new());
        block_on(store.put(key, record)).unwrap();
        let deps = RegistryDeps { store, env: Rc::new(NativeEnvironment::default()), sandbox: None, judges: Judges::default() };
        block_on(Registry::load(EmergentConfig::default(), deps, "agent1")).expect_err("refused")
    };
    // A forged tool's record as the current build writes it, but stamped v2.
    let r = promoted_rig(Rc::new(MemoryStore::new()));
    let mut record = block_on(r.store.get("agent/agent1/tool/slugify")).unwrap().unwrap();
    record["v"] = json!(2);
    let err = load("agent/agent1/tool/slugify", record.clone());
    assert_eq!(err.code(), "store_corrupt");
    assert!(err.to_string().contains("newer version") && err.to_string().contains("agent/agent1/tool/slugify"), "{err}");
    record["v"] = json!(1);
    record["kind"] = json!("stats");
    assert!(load("agent/agent1/tool/slugify", record).to_string().contains("a `stats` record where a `tool` record belongs"));
}

#[test]
fn a_store_error_keeps_its_code_through_the_registry() {
    use crucible::store::StoreError;
    for code in ["store_quota", "store_blocked", "store_corrupt"] {
        assert_eq!(RegistryError::Store(StoreError::new(code, "x")).code(), code);
    }
    assert_eq!(RegistryError::Store(StoreError::new("disk_on_fire", "x")).code(), "store_error");
}

#[test]
fn a_lifecycle_change_whose_write_fails_is_undone_in_memory_and_can_be_retried() {
    let memory = Rc::new(MemoryStore::new());
    let store = Rc::new(SharedDataStore::new(memory.clone()));
    let r = rig_over("agent1", promo_config(), Some(approving_judge()), Some(approving_judge()), memory.clone(), store.clone());
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    let tier = |r: &Rig| r.registry.list("s1").iter().find(|t| t.name == "slugify").map(|t| t.tier);
    let audit_len = |r: &Rig| r.registry.audit_trail().len();

    // session → agent
    store.refuse_writes.set(true);
    let before = audit_len(&r);
    let err = block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap_err();
    assert_eq!(err.code(), "store_quota");
    assert_eq!(tier(&r), Some(Tier::Session), "still where the store has it");
    let added: Vec<_> = r.registry.audit_trail()[before..].iter().map(|e| e.action.clone()).collect();
    assert_eq!(added, ["verdict", "verdict"], "no audit entry for what did not happen: the panel's verdicts did");
    store.refuse_writes.set(false);
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
    assert_eq!(tier(&r), Some(Tier::Agent));

    // agent → shared: the request, then the approval
    store.refuse_writes.set(true);
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap_err().code(), "store_quota");
    assert!(r.registry.pending_approvals().is_empty(), "no approval the store does not hold");
    store.refuse_writes.set(false);
    let approval = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    store.refuse_writes.set(true);
    assert_eq!(block_on(r.registry.approve(&approval.id)).unwrap_err().code(), "store_quota");
    assert_eq!(r.registry.pending_approvals().len(), 1, "the approval can be approved again");
    assert_eq!(tier(&r), Some(Tier::Agent));
    store.refuse_writes.set(false);
    assert_eq!(block_on(r.registry.approve(&approval.id)).unwrap().tier, Tier::Shared);

    // demote, and a denied request
    store.refuse_writes.set(true);
    assert_eq!(block_on(r.registry.demote("slugify", "s1")).unwrap_err().code(), "store_quota");
    assert_eq!(tier(&r), Some(Tier::Shared));
    store.refuse_writes.set(false);
    assert_eq!(block_on(r.registry.demote("slugify", "s1")).unwrap().tier, Tier::Agent);
    let approval = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    store.refuse_writes.set(true);
    assert_eq!(block_on(r.registry.deny(&approval.id, "no")).unwrap_err().code(), "store_quota");
    assert_eq!(r.registry.pending_approvals().len(), 1);
    store.refuse_writes.set(false);
    block_on(r.registry.deny(&approval.id, "no")).unwrap();
    assert!(r.registry.pending_approvals().is_empty());

    // rollback
    forge_ok(&r, "other", SLUGIFY_JS, "s1");
    forge_ok(&r, "other", SLUGIFY_V2_JS, "s1");
    let version = |r: &Rig| r.registry.list("s1").iter().find(|t| t.name == "other").map(|t| t.version);
    store.refuse_writes.set(true);
    assert_eq!(block_on(r.registry.rollback("other", 1, "s1")).unwrap_err().code(), "store_quota");
    assert_eq!(version(&r), Some(2));
    store.refuse_writes.set(false);
    assert_eq!(block_on(r.registry.rollback("other", 1, "s1")).unwrap().version, 1);

    // A restart reads the same registry this one shows.
    let restarted = rig_over("agent1", promo_config(), Some(approving_judge()), None, memory.clone(), store.clone());
    let persisted = |r: &Rig| r.registry.list("s2").iter().map(|t| (t.name.clone(), t.tier, t.version, t.hash.clone())).collect::<Vec<_>>();
    assert_eq!(persisted(&restarted), persisted(&r));
    assert_eq!(restarted.registry.audit_trail(), r.registry.audit_trail());
    assert!(restarted.registry.pending_approvals().is_empty());
}

#[test]
fn forges_running_at_once_still_keep_to_max_session_tools() {
    let r = rig_with(EmergentConfig { max_session_tools: 2, ..Default::default() }, Some(approving_judge()), None, Rc::new(MemoryStore::new()));
    let requests: Vec<_> = (0..5).map(|i| slugify_request(&format!("t{i}"), SLUGIFY_JS)).collect();
    let results = block_on(futures::future::join_all(requests.iter().map(|q| r.registry.forge(q, "s1"))));
    assert_eq!(results.iter().filter(|res| res.success).count(), 2, "{results:?}");
    assert!(results.iter().filter(|res| !res.success).all(|res| res.reason.as_deref().unwrap_or_default().contains("maxSessionTools")));
    assert_eq!(r.registry.list("s1").len(), 2);
}

#[test]
fn a_call_by_the_name_a_forge_was_asked_for_is_told_the_name_the_tool_got() {
    let r = rig();
    let res = block_on(r.registry.forge(&slugify_request("Slug Maker", SLUGIFY_JS), "s"));
    assert!(res.success, "{res:?}");
    let failure = block_on(r.registry.call("Slug Maker", json!({ "text": "A b" }), "s")).unwrap_err();
    assert_eq!(failure.code, "unknown_tool");
    assert!(failure.message.contains("`Slug_Maker`"), "{}", failure.message);
    assert!(block_on(r.registry.call("Slug_Maker", json!({ "text": "A b" }), "s")).is_ok());
    // A name that matches nothing gets no hint.
    let unknown = block_on(r.registry.call("no such tool", json!({}), "s")).unwrap_err();
    assert_eq!(unknown.message, "no tool named `no such tool`");
}

#[test]
fn a_forge_that_ends_after_its_session_ended_does_not_bring_the_session_back() {
    let r = rig();
    let request = slugify_request("late", SLUGIFY_JS);
    let end_meanwhile = async {
        support::YieldOnce::default().await; // the forge is at its judge by now
        r.registry.end_session("e").await.unwrap();
    };
    let (res, ()) = block_on(futures::future::join(r.registry.forge(&request, "e"), end_meanwhile));
    assert!(!res.success && res.reason.as_deref().unwrap_or_default().contains("ended"), "{res:?}");
    assert!(r.registry.list("e").is_empty());
    assert_eq!(block_on(r.registry.call("late", json!({ "text": "x" }), "e")).unwrap_err().code, "unknown_tool");
    forge_ok(&r, "late", SLUGIFY_JS, "e"); // the session id can start afresh
}

#[test]
fn promotions_running_at_once_still_keep_to_max_agent_tools() {
    let config = EmergentConfig { max_agent_tools: 1, ..promo_config() };
    let r = rig_with(config, Some(approving_judge()), Some(approving_judge()), Rc::new(MemoryStore::new()));
    for name in ["a", "b", "c"] {
        forge_ok(&r, name, SLUGIFY_JS, "s1");
        use_n(&r, name, 3, "s1");
    }
    let outcomes = block_on(futures::future::join_all(["a", "b", "c"].map(|n| r.registry.request_promotion(n, Tier::Agent, "s1"))));
    let promoted = outcomes.iter().filter(|o| o.as_ref().unwrap().status == PromotionStatus::Promoted).count();
    assert_eq!(promoted, 1, "{outcomes:?}");
    assert_eq!(r.registry.list("s1").iter().filter(|t| t.tier == Tier::Agent).count(), 1);
}

#[test]
fn calls_crossing_the_threshold_together_convene_one_panel() {
    let (r, panel) = auto_promoting_rig_with_slugify();
    use_n(&r, "slugify", 2, "s1");
    let args = json!({ "text": "A b" });
    let calls = block_on(futures::future::join_all((0..4).map(|_| r.registry.call("slugify", args.clone(), "s1"))));
    assert!(calls.iter().all(Result::is_ok));
    assert_eq!(panel.requests.borrow().len(), 2, "one promotion: one safety and one correctness review");
    assert_eq!(r.registry.list("s1")[0].tier, Tier::Agent);
}

#[test]
fn work_in_flight_when_the_agent_closes_writes_nothing_more_to_its_store() {
    let store = Rc::new(MemoryStore::new());
    let r = promoted_rig(store.clone());
    let before = block_on(store.scan("")).unwrap();
    let request = slugify_request("late", SLUGIFY_JS);
    let close_meanwhile = async {
        support::YieldOnce::default().await; // the forge is at its judge by now
        r.registry.close();
    };
    let (res, ()) = block_on(futures::future::join(r.registry.forge(&request, "s1"), close_meanwhile));
    assert!(res.success, "the forge itself finishes: {res:?}");
    use_n(&r, "slugify", 50, "s1"); // agent-tier calls whose stats would be flushed
    assert_eq!(block_on(r.registry.flush_stats()).unwrap_err().code(), "closed");
    assert_eq!(block_on(store.scan("")).unwrap(), before, "nothing written after close");
}

#[test]
fn a_forge_the_agent_was_closed_under_ends_without_an_outcome() {
    // Closing the agent stops its sandbox too, so the tests it ended say nothing of the code:
    // the caller's forge ends unsettled (the host says `closed`), with no rejection announced.
    let store = Rc::new(MemoryStore::new());
    let r = promoted_rig(store);
    let announced = r.events.types().len();
    let request = slugify_request("late", SLUGIFY_JS);
    let close_meanwhile = async {
        support::YieldOnce::default().await;
        r.registry.close();
    };
    let (res, ()) = block_on(futures::future::join(r.registry.forge_cancellable(&request, "s1", None, None, ""), close_meanwhile));
    assert!(res.is_none(), "{res:?}");
    let types = r.events.types()[announced..].to_vec();
    assert!(!types.iter().any(|t| t == "forge.rejected" || t == "forge.registered"), "{types:?}");
    assert!(r.registry.is_closed());
}

#[test]
fn above_the_session_tier_a_rollback_or_an_approval_never_brings_back_an_unreviewed_version() {
    let r = rig_with(promo_config(), Some(approving_judge()), Some(approving_judge()), Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    forge_ok(&r, "slugify", SLUGIFY_V2_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
    // The panel reviewed version 2 only: version 1 does not come back at the agent tier.
    let err = block_on(r.registry.rollback("slugify", 1, "s1")).unwrap_err();
    assert_eq!(err.code(), "unreviewed_version", "{err}");
    // The tool's info says so beforehand, as a rollback picker needs.
    let info = r.registry.list("s1").into_iter().find(|t| t.name == "slugify").unwrap();
    assert_eq!((info.versions, info.restorable_versions), (vec![1, 2], vec![2]));

    // The human is asked about version 2; version 3 is promoted before they answer.
    let asked = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    forge_ok(&r, "slugify", &format!("{SLUGIFY_JS} // v3"), "s1");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
    // The request for version 2 was withdrawn with it.
    assert!(matches!(block_on(r.registry.approve(&asked.id)), Err(RegistryError::NoSuchApproval(_))));
    assert!(withdrawals(&r, "slugify").iter().any(|w| w.contains(&asked.id) && w.contains("another version was promoted")));
    assert!(r.registry.list("s1").iter().all(|t| t.tier != Tier::Shared));
    // Promoting version 3 kept the versions before it.
    assert_eq!(r.registry.list("s1")[0].versions, vec![1, 2, 3]);

    // Asked again about the version that is there, the approval goes through.
    let asked = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    let shared = block_on(r.registry.approve(&asked.id)).unwrap();
    assert_eq!(shared.tier, Tier::Shared);
    assert_eq!(block_on(r.registry.rollback("slugify", shared.version - 1, "s1")).unwrap_err().code(), "unreviewed_version");
}

#[test]
fn a_demoted_tool_does_not_displace_the_version_the_tier_below_is_using() {
    let r = rig_with(promo_config(), Some(approving_judge()), Some(approving_judge()), Rc::new(MemoryStore::new()));
    let hash_at =
        |tier: Tier| r.registry.list("s1").into_iter().find(|t| t.name == "slugify" && t.tier == tier && t.status == ToolStatus::Active).map(|t| t.hash);
    // v1 goes up to the shared tier; v2 is forged since and promoted to the agent tier.
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
    let asked = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    let v1 = block_on(r.registry.approve(&asked.id)).unwrap().hash;
    forge_ok(&r, "slugify", SLUGIFY_V2_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
    let v2 = hash_at(Tier::Agent).expect("v2 at the agent tier");
    assert_ne!(v1, v2);

    // Demoting the shared v1 leaves the agent tier's v2 current; v1 can be rolled back to.
    let demoted = block_on(r.registry.demote("slugify", "s1")).unwrap();
    assert_eq!((demoted.tier, &demoted.hash), (Tier::Agent, &v2));
    assert_eq!(hash_at(Tier::Agent).as_ref(), Some(&v2));
    assert!(r.registry.audit_trail().last().unwrap().detail.contains("stays current"));
    let agent = r.registry.list("s1").into_iter().find(|t| t.tier == Tier::Agent).unwrap();
    assert!(agent.versions.contains(&1), "{:?}", agent.versions);

    // Likewise a session's own newer forge stays what the session runs when the agent tier's is demoted.
    forge_ok(&r, "slugify", &format!("{SLUGIFY_JS} // v3"), "s1");
    let v3 = hash_at(Tier::Session).expect("v3 in the session");
    let demoted = block_on(r.registry.demote("slugify", "s1")).unwrap();
    assert_eq!((demoted.tier, &demoted.hash), (Tier::Session, &v3));
    assert_eq!(hash_at(Tier::Agent), None, "out of the agent tier");
}

#[test]
fn a_demotion_into_a_session_keeps_the_hold_off_on_the_demoted_version_that_session_runs() {
    let config = EmergentConfig { auto_promote: true, ..promo_config() };
    let r = rig_with(config, Some(approving_judge()), Some(approving_judge()), Rc::new(MemoryStore::new()));
    let tier_in =
        |session: &str| r.registry.list(session).into_iter().find(|t| t.name == "slugify" && t.status == ToolStatus::Active).map(|t| (t.tier, t.version));
    // s1's v1 promotes itself, and an operator demotes it back into s1: held off there.
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(tier_in("s1"), Some((Tier::Agent, 1)));
    block_on(r.registry.demote("slugify", "s1")).unwrap();
    assert_eq!(tier_in("s1"), Some((Tier::Session, 1)));
    // s2's v2 promotes itself; demoting it from s1 leaves s1 running its own (demoted) v1.
    forge_ok(&r, "slugify", SLUGIFY_V2_JS, "s2");
    use_n(&r, "slugify", 3, "s2");
    assert_eq!(tier_in("s2"), Some((Tier::Agent, 2)));
    block_on(r.registry.demote("slugify", "s1")).unwrap();
    assert_eq!(tier_in("s1"), Some((Tier::Session, 1)));

    // The operator's first demotion still holds: v1's uses do not bring it back up.
    use_n(&r, "slugify", 5, "s1");
    assert_eq!(tier_in("s1"), Some((Tier::Session, 1)));
}

/// A store over `MemoryStore` whose reads and batches take some polls each (a slow or stuck
/// IndexedDB): a test double. `shares_data` says whether it names the inner store's data.
struct Delayed {
    memory: Rc<MemoryStore>,
    read_polls: usize,
    write_polls: usize,
    shares_data: bool,
}

async fn polls(n: usize) {
    for _ in 0..n {
        support::YieldOnce::default().await;
    }
}

#[async_trait::async_trait(?Send)]
impl Store for Delayed {
    async fn get(&self, key: &str) -> Result<Option<serde_json::Value>, crucible::store::StoreError> {
        polls(self.read_polls).await;
        self.memory.get(key).await
    }
    async fn put(&self, key: &str, value: serde_json::Value) -> Result<(), crucible::store::StoreError> {
        self.memory.put(key, value).await
    }
    async fn delete(&self, key: &str) -> Result<(), crucible::store::StoreError> {
        self.memory.delete(key).await
    }
    async fn scan(&self, prefix: &str) -> Result<Vec<(String, serde_json::Value)>, crucible::store::StoreError> {
        self.memory.scan(prefix).await
    }
    async fn batch(&self, ops: Vec<crucible::store::BatchOp>) -> Result<(), crucible::store::StoreError> {
        polls(self.write_polls).await;
        self.memory.batch(ops).await
    }
    fn data_key(&self) -> usize {
        if self.shares_data {
            self.memory.data_key()
        } else {
            0
        }
    }
}

#[test]
fn a_slow_store_holds_up_the_shared_stats_flushes_of_its_own_agents_only() {
    let config = EmergentConfig { stats_flush_every: 1000, ..promo_config() };
    let slow_memory = store_with_shared_slugify();
    let slow_reads = Delayed { memory: slow_memory.clone(), read_polls: 50, write_polls: 0, shares_data: false };
    let slow = rig_over("slow", config.clone(), Some(approving_judge()), None, slow_memory, Rc::new(slow_reads));
    let other_memory = store_with_shared_slugify();
    let other = rig_over("other", config, Some(approving_judge()), None, other_memory.clone(), other_memory.clone());
    use_n(&slow, "slugify", 2, "a");
    use_n(&other, "slugify", 2, "b");
    let (slow_flush, other_flush) = (Box::pin(slow.registry.flush_stats()), Box::pin(other.registry.flush_stats()));
    let first = block_on(futures::future::select(slow_flush, other_flush));
    assert!(matches!(first, futures::future::Either::Right((Ok(()), _))), "the other store's flush did not wait for the slow one");
    assert_eq!(stored_shared_calls(&other_memory), 3 + 2);
}

#[test]
fn a_reload_of_the_shared_tier_keeps_this_agents_approval_still_being_written() {
    let memory = Rc::new(MemoryStore::new());
    let slow_writes = Delayed { memory: memory.clone(), read_polls: 0, write_polls: 3, shares_data: true };
    let r = rig_over("agent1", promo_config(), Some(approving_judge()), Some(approving_judge()), memory, Rc::new(slow_writes));
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
    let approval = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    // Another agent's change makes this one reload while its own approval is being written.
    let (approved, reloaded) = block_on(futures::future::join(r.registry.approve(&approval.id), r.registry.reload_shared()));
    approved.unwrap();
    reloaded.unwrap();
    assert_eq!(r.registry.list("s1").iter().map(|t| t.tier).collect::<Vec<_>>(), vec![Tier::Shared]);
    assert_eq!(block_on(r.registry.call("slugify", json!({ "text": "A b" }), "s2")).unwrap(), json!({ "slug": "a-b" }));
}

#[test]
fn a_shared_tool_demoted_by_another_agent_goes_back_to_its_owner_not_to_the_demoter() {
    let store = Rc::new(MemoryStore::new());
    shared_rig(store.clone());
    let other = rig_for("agent2", promo_config(), Some(approving_judge()), None, store.clone());
    let demoted = block_on(other.registry.demote("slugify", "z")).unwrap();
    assert_eq!(demoted.tier, Tier::Agent);
    // The demoter did not gain it: it only sees the shared tombstone.
    let seen: Vec<_> = other.registry.list("z").into_iter().map(|t| (t.tier, t.status)).collect();
    assert_eq!(seen, vec![(Tier::Shared, ToolStatus::Demoted)]);
    assert_eq!(block_on(other.registry.call("slugify", json!({ "text": "A b" }), "z")).unwrap_err().code, "denied");
    // Its owner finds it in its own agent tier when it next loads.
    let owner_again = rig_for("agent1", promo_config(), Some(approving_judge()), None, store);
    let tiers: Vec<_> = owner_again.registry.list("s9").into_iter().filter(|t| t.status == ToolStatus::Active).map(|t| t.tier).collect();
    assert_eq!(tiers, vec![Tier::Agent]);
    assert_eq!(block_on(owner_again.registry.call("slugify", json!({ "text": "A b" }), "s9")).unwrap(), json!({ "slug": "a-b" }));
}

#[test]
fn a_shared_promotion_asked_again_after_the_tool_changed_replaces_the_stale_request() {
    let r = rig_with(promo_config(), Some(approving_judge()), Some(approving_judge()), Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap();
    let stale = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    forge_ok(&r, "slugify", SLUGIFY_V2_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
    let fresh = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    assert_ne!(fresh.id, stale.id);
    assert_ne!(fresh.hash, stale.hash);
    assert_eq!(r.registry.pending_approvals().len(), 1);
    assert_eq!(block_on(r.registry.approve(&stale.id)).unwrap_err().code(), "no_such_approval");
    assert_eq!(block_on(r.registry.approve(&fresh.id)).unwrap().tier, Tier::Shared);
}

#[test]
fn a_demotion_by_another_agent_does_not_overwrite_the_owners_own_agent_tier_tool() {
    let store = Rc::new(MemoryStore::new());
    let owner = shared_rig(store.clone());
    // The owner promotes a newer version of its own to its agent tier meanwhile.
    forge_ok(&owner, "slugify", SLUGIFY_V2_JS, "s2");
    use_n(&owner, "slugify", 3, "s2");
    assert_eq!(block_on(owner.registry.request_promotion("slugify", Tier::Agent, "s2")).unwrap().status, PromotionStatus::Promoted);
    let own = block_on(store.get("agent/agent1/tool/slugify")).unwrap();
    let other = rig_for("agent2", promo_config(), Some(approving_judge()), None, store.clone());
    block_on(other.registry.demote("slugify", "z")).unwrap();
    assert_eq!(block_on(store.get("agent/agent1/tool/slugify")).unwrap(), own, "the owner's newer tool stays as it was");
    assert!(other.registry.list("z").iter().all(|t| t.status == ToolStatus::Demoted));
}

#[test]
fn tools_stored_before_versions_recorded_their_review_still_roll_back_to_the_version_in_service() {
    let store = Rc::new(MemoryStore::new());
    let r = promoted_rig(store.clone());
    let version = r.registry.list("s1")[0].version;
    // As an earlier build stored it: no `reviewedFor` anywhere.
    let mut record = block_on(store.get("agent/agent1/tool/slugify")).unwrap().unwrap();
    record["data"]["current"].as_object_mut().unwrap().remove("reviewedFor");
    for v in record["data"]["history"].as_array_mut().unwrap() {
        v.as_object_mut().unwrap().remove("reviewedFor");
    }
    block_on(store.put("agent/agent1/tool/slugify", record)).unwrap();
    let reloaded = rig_with(promo_config(), Some(approving_judge()), Some(approving_judge()), store);
    assert_eq!(block_on(reloaded.registry.rollback("slugify", version, "s1")).unwrap().version, version);
}

#[test]
fn calls_running_while_their_tool_is_promoted_count_where_it_went() {
    let config = EmergentConfig { auto_promote: true, promotion_threshold: PromotionThreshold { uses: 1, confidence: 0.8 }, ..promo_config() };
    let r = rig_with(config, Some(approving_judge()), Some(approving_judge()), Rc::new(MemoryStore::new()));
    let text = json!({ "type": "object", "properties": { "text": { "type": "string" } }, "required": ["text"] });
    let mut tools = host_tools();
    // The tests' inputs and "fast" return at once; the other calls take longer than a
    // promotion's review (its test re-run and two reviewers).
    let slow_upper = support::FnTool::with_delay(
        |a| Ok(json!({ "text": a["text"].as_str().unwrap_or_default().to_uppercase() })),
        |a| if ["fast", "a", "b c"].contains(&a["text"].as_str().unwrap_or_default()) { 0 } else { 2_000 },
    );
    tools.insert(crucible::tools::Tool::new("slow_upper", "Upper-cases text, slowly", &text, None, slow_upper).unwrap());
    r.registry.set_host_tools(tools);
    let request = json!({
        "name": "shout", "description": "Upper-cases text", "inputSchema": text, "outputSchema": text,
        "implementation": { "mode": "compose", "steps": [{ "name": "up", "tool": "slow_upper", "inputMapping": { "text": "$input.text" } }] },
        "testCases": [{ "input": { "text": "a" }, "expectedOutput": { "text": "A" } }, { "input": { "text": "b c" }, "expectedOutput": { "text": "B C" } }]
    });
    assert!(block_on(r.registry.forge(&request, "s1")).success);
    // Four calls at once: the fast one crosses the threshold and promotes the tool while the
    // other three still run.
    let inputs = ["fast", "x", "y", "z"];
    let calls = block_on(futures::future::join_all(inputs.map(|t| r.registry.call("shout", json!({ "text": t }), "s1"))));
    assert!(calls.iter().all(Result::is_ok));
    let info = r.registry.list("s1").into_iter().find(|t| t.name == "shout").unwrap();
    assert_eq!((info.tier, info.stats.calls, info.stats.successes), (Tier::Agent, 4, 4));
}

#[test]
fn forging_the_same_request_again_answers_with_the_tool_as_it_is_without_asking_the_judge() {
    let judge = approving_judge();
    let config = EmergentConfig { persist_sandbox_source: true, ..promo_config() };
    let r = rig_with(config, Some(judge.clone()), Some(approving_judge()), Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 2, "s1");
    let (judged, tested) = (judge.requests.borrow().len(), r.sandbox.requests.borrow().len());
    r.events.0.borrow_mut().clear();

    let again = block_on(r.registry.forge(&slugify_request("slugify", SLUGIFY_JS), "s1"));
    assert!(again.success && again.unchanged, "{again:?}");
    let tool = again.tool.unwrap();
    assert_eq!((tool.version, tool.tier, tool.stats.calls), (1, Tier::Session, 2), "the same version, its uses kept");
    assert_eq!(again.verdict.map(|v| v.confidence), Some(0.9), "the verdict it was registered with");
    assert_eq!(judge.requests.borrow().len(), judged, "the judge is not asked again");
    assert_eq!(r.sandbox.requests.borrow().len(), tested, "nor are the tests re-run");
    assert_eq!(again.tests, Some(vec![]));
    assert!(matches!(r.events.bodies().last(), Some(EventBody::ForgeRegistered { version: 1, unchanged: true, .. })), "{:?}", r.events.types());
    let last = r.registry.audit_trail().pop().unwrap();
    assert_eq!((last.action.as_str(), last.version), ("unchanged", Some(1)));
    let stats = r.registry.stats();
    assert_eq!((stats.attempts, stats.approved, stats.approved_confidence_sum), (1, 1, 0.9), "nothing was forged: not counted");

    // Anything different is a new version, judged.
    let changed = block_on(r.registry.forge(&slugify_request("slugify", SLUGIFY_V2_JS), "s1"));
    assert!(changed.success && !changed.unchanged && changed.tool.unwrap().version == 2, "{:?}", changed.reason);
    assert_eq!(judge.requests.borrow().len(), judged + 1);
    let back = block_on(r.registry.forge(&slugify_request("slugify", SLUGIFY_JS), "s1"));
    assert!(!back.unchanged && back.tool.unwrap().version == 3, "v1's content again is new: v2 is the current one");
    // Another session does not reach s1's tool: its forge is checked in full.
    forge_ok(&r, "slugify", SLUGIFY_JS, "s2");
    assert_eq!(judge.requests.borrow().len(), judged + 3);
}

#[test]
fn importing_the_tool_the_session_already_has_answers_with_it_as_it_is_without_asking_the_judge() {
    let judge = approving_judge();
    let config = EmergentConfig { persist_sandbox_source: true, ..promo_config() };
    let r = rig_with(config, Some(judge.clone()), Some(approving_judge()), Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 2, "s1");
    let package = r.registry.export("slugify", "s1").unwrap();
    let (judged, tested, stats) = (judge.requests.borrow().len(), r.sandbox.requests.borrow().len(), r.registry.stats());

    // The same content as the session's current version: checked already, by this judge.
    let again = block_on(r.registry.import(&package, "s1")).unwrap();
    assert!(again.success && again.unchanged, "{again:?}");
    let tool = again.tool.unwrap();
    assert_eq!((tool.version, tool.tier, tool.stats.calls), (1, Tier::Session, 2), "the same version, its uses kept");
    assert_eq!(judge.requests.borrow().len(), judged, "the judge is not asked again");
    assert_eq!(r.sandbox.requests.borrow().len(), tested, "nor are the tests re-run");
    assert_eq!(r.registry.stats(), stats, "nothing was imported: not counted");
    assert!(matches!(r.events.bodies().last(), Some(EventBody::ForgeRegistered { version: 1, unchanged: true, .. })), "{:?}", r.events.types());
    let last = r.registry.audit_trail().pop().unwrap();
    assert_eq!((last.action.as_str(), last.version), ("import.unchanged", Some(1)));

    // Where it would land as something new (another session; a changed tool), it is checked in full.
    assert!(!block_on(r.registry.import(&package, "s2")).unwrap().unchanged);
    assert_eq!(judge.requests.borrow().len(), judged + 1);
    forge_ok(&r, "slugify", SLUGIFY_V2_JS, "s1");
    let imported = block_on(r.registry.import(&package, "s1")).unwrap();
    assert!(imported.success && !imported.unchanged && imported.tool.as_ref().is_some_and(|t| t.version == 4), "{imported:?}");
    assert_eq!(judge.requests.borrow().len(), judged + 3);
}

#[test]
fn forging_a_promoted_tool_again_in_a_new_session_answers_with_the_promoted_tool() {
    let judge = approving_judge();
    let r = rig_with(promo_config(), Some(judge.clone()), Some(approving_judge()), Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
    let judged = judge.requests.borrow().len();
    let again = block_on(r.registry.forge(&slugify_request("slugify", SLUGIFY_JS), "s2"));
    assert!(again.unchanged, "{again:?}");
    assert_eq!(again.tool.unwrap().tier, Tier::Agent, "no session copy shadows the promoted tool");
    assert_eq!(judge.requests.borrow().len(), judged);
    assert!(r.registry.list("s2").iter().all(|t| t.tier == Tier::Agent));
}

/// A compose `count_it` over the host tool `word_count`.
fn word_counter(description: &str) -> serde_json::Value {
    json!({
        "name": "count_it", "description": description,
        "inputSchema": { "type": "object", "properties": { "text": { "type": "string" } }, "required": ["text"] },
        "outputSchema": { "type": "object", "properties": { "count": { "type": "number" } }, "required": ["count"] },
        "implementation": { "mode": "compose", "steps": [{ "name": "c", "tool": "word_count", "inputMapping": { "text": "$input.text" } }] },
        "testCases": [{ "input": { "text": "a b" }, "expectedOutput": { "count": 2 } }, { "input": { "text": "a b c" }, "expectedOutput": { "count": 3 } }]
    })
}

#[test]
fn a_forge_identical_to_a_tool_the_session_can_no_longer_call_is_checked_in_full_and_says_why() {
    let judge = approving_judge();
    let r = rig_with(EmergentConfig::default(), Some(judge.clone()), None, Rc::new(MemoryStore::new()));
    assert!(block_on(r.registry.forge(&word_counter("Counts words"), "s1")).success);
    assert!(r.registry.tool_set("s1").contains("count_it"), "built and offered (its build is cached on the entry)");
    r.registry.set_host_tools(crucible::tools::ToolSet::new()); // the host no longer has word_count
    assert!(!r.registry.tool_set("s1").contains("count_it"));
    let again = block_on(r.registry.forge(&word_counter("Counts words"), "s1"));
    assert!(!again.success && !again.unchanged, "{again:?}");
    let reason = again.reason.unwrap();
    assert!(reason.contains("unknown tool `word_count`; available tools: none"), "the tool it cannot call is not offered either: {reason}");
    assert_eq!(judge.requests.borrow().len(), 1);
}

#[test]
fn a_stored_pipeline_whose_step_is_gone_is_left_out_of_the_tool_set_instead_of_recursing_until_the_stack_overflows() {
    let store = Rc::new(MemoryStore::new());
    let r = rig_with(EmergentConfig { max_agent_tools: 5, ..promo_config() }, Some(approving_judge()), Some(approving_judge()), store.clone());
    assert!(block_on(r.registry.forge(&word_counter("Counts words"), "s1")).success);
    for _ in 0..3 {
        block_on(r.registry.call("count_it", json!({ "text": "a b" }), "s1")).unwrap();
    }
    assert_eq!(block_on(r.registry.request_promotion("count_it", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
    r.registry.close();
    // A restart whose host has no word_count: the stored pipeline has no build cached yet.
    let restarted = rig_with(promo_config(), Some(approving_judge()), Some(approving_judge()), store);
    restarted.registry.set_host_tools(crucible::tools::ToolSet::new());
    let names: Vec<String> = restarted.registry.tool_set("s2").names().map(str::to_string).collect();
    assert_eq!(names, vec!["forge_tool".to_string()]);
    let err = block_on(restarted.registry.call("count_it", json!({ "text": "x" }), "s2")).unwrap_err();
    assert_eq!(err.code, "unknown_tool", "{err:?}");
    assert!(err.message.contains("cannot be called by this session: compose pipeline rejected: step `c` uses unknown tool `word_count`"), "{}", err.message);
}

/// A host tool that calls the forged tool `loop_it` back through the registry, on the same
/// stack, at the depth it was called at (what the wasm layer does for `agent.tools.call` made
/// by a host tool before its first await), and answers with its input when that fails.
struct CallsBack(std::cell::RefCell<std::rc::Weak<crucible::registry::Registry>>, std::cell::Cell<u32>);

#[async_trait::async_trait(?Send)]
impl crucible::tools::ToolHandler for CallsBack {
    async fn call(&self, args: serde_json::Value, ctx: &crucible::tools::CallContext) -> Result<serde_json::Value, crucible::tools::ToolFailure> {
        self.1.set(self.1.get() + 1);
        let registry = self.0.borrow().upgrade().unwrap();
        let nested = registry.call_as("loop_it", args.clone(), &ctx.session_id, "", ctx.nesting()).await;
        Ok(nested.unwrap_or(args))
    }
}

#[test]
fn a_host_tool_calling_back_a_pipeline_over_itself_meets_the_pipeline_nesting_limit() {
    // No automatic promotion: its re-run of the tests would call the relay too.
    let r = rig_with(promo_config(), Some(approving_judge()), None, Rc::new(MemoryStore::new()));
    let handler = Rc::new(CallsBack(Default::default(), Default::default()));
    *handler.0.borrow_mut() = Rc::downgrade(&r.registry);
    let text = json!({ "type": "object", "properties": { "text": { "type": "string" } }, "required": ["text"] });
    let mut tools = host_tools();
    tools.insert(crucible::tools::Tool::new("relay", "Runs loop_it", &text, None, handler.clone()).unwrap());
    r.registry.set_host_tools(tools);
    let loop_it = json!({
        "name": "loop_it", "description": "Relays the text", "inputSchema": text, "outputSchema": text,
        "implementation": { "mode": "compose", "steps": [{ "name": "r", "tool": "relay", "inputMapping": { "text": "$input.text" } }] },
        "testCases": [{ "input": { "text": "a" }, "expectedOutput": { "text": "a" } }, { "input": { "text": "b" }, "expectedOutput": { "text": "b" } }]
    });
    assert!(block_on(r.registry.forge(&loop_it, "s1")).success);
    handler.1.set(0);
    assert_eq!(block_on(r.registry.call("loop_it", json!({ "text": "x" }), "s1")).unwrap(), json!({ "text": "x" }));
    assert_eq!(handler.1.get(), crucible::forge::MAX_COMPOSE_DEPTH, "one relay per nesting level, then the limit");
    // A forge's tests that reach loop_it through the relay are trials there too: not uses.
    let calls = |name: &str| r.registry.list("s1").into_iter().find(|t| t.name == name).unwrap().stats.calls;
    let before = calls("loop_it");
    let mut over = loop_it.clone();
    over["name"] = json!("relay_again");
    assert!(block_on(r.registry.forge(&over, "s1")).success);
    assert_eq!(calls("loop_it"), before, "the tests' calls back did not count as uses of loop_it");

    // Four relays per level: the call's step budget holds across the host tool too (with a
    // fresh budget per call back, one call made 4 + 16 + … + 4^8 = 87,380 relay calls).
    let relay = json!({ "name": "r", "tool": "relay", "inputMapping": { "text": "$prev.text" } });
    let mut wide = loop_it.clone();
    wide["implementation"]["steps"] =
        json!([{ "name": "r0", "tool": "relay", "inputMapping": { "text": "$input.text" } }, relay.clone(), relay.clone(), relay]);
    wide["implementation"]["steps"][1]["name"] = json!("r1");
    wide["implementation"]["steps"][2]["name"] = json!("r2");
    wide["implementation"]["steps"][3]["name"] = json!("r3");
    wide["description"] = json!("Relays the text four times");
    assert!(block_on(r.registry.forge(&wide, "s1")).success);
    handler.1.set(0);
    let _ = block_on(r.registry.call("loop_it", json!({ "text": "x" }), "s1"));
    assert!(handler.1.get() <= crucible::forge::MAX_PIPELINE_STEPS, "{} relay calls for one call", handler.1.get());
}

/// A demotion takes back the review that let the version into the tier it left: a rollback
/// there cannot bring it back past the panel (agent) or the human (shared) it never saw again.
#[test]
fn a_version_demoted_from_a_tier_is_not_restored_there_by_a_rollback() {
    // Agent tier: v1 promoted, demoted to the session, v2 forged and promoted over it.
    let r = promoted_rig(Rc::new(MemoryStore::new()));
    block_on(r.registry.demote("slugify", "s1")).unwrap();
    forge_ok(&r, "slugify", SLUGIFY_V2_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
    let info = r.registry.list("s1").into_iter().find(|t| t.tier == Tier::Agent).unwrap();
    assert_eq!((info.versions, info.restorable_versions), (vec![1, 2], vec![2]));
    assert_eq!(block_on(r.registry.rollback("slugify", 1, "s1")).unwrap_err().code(), "unreviewed_version");

    // The same after a restart, where only the agent tier's tombstone remembers v1.
    let store = Rc::new(MemoryStore::new());
    let r = promoted_rig(store.clone());
    block_on(r.registry.demote("slugify", "s1")).unwrap();
    let r = rig_with(promo_config(), Some(approving_judge()), Some(approving_judge()), store);
    forge_ok(&r, "slugify", SLUGIFY_V2_JS, "s2");
    use_n(&r, "slugify", 3, "s2");
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, "s2")).unwrap().status, PromotionStatus::Promoted);
    assert_eq!(block_on(r.registry.rollback("slugify", 1, "s2")).unwrap_err().code(), "unreviewed_version", "after a restart");

    // Shared tier: v1 approved, demoted by its owner, v2 approved over it.
    let r = shared_rig(Rc::new(MemoryStore::new()));
    assert_eq!(block_on(r.registry.demote("slugify", "s1")).unwrap().tier, Tier::Agent);
    forge_ok(&r, "slugify", SLUGIFY_V2_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
    let asked = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    assert_eq!(block_on(r.registry.approve(&asked.id)).unwrap().version, 2);
    assert_eq!(block_on(r.registry.rollback("slugify", 1, "s1")).unwrap_err().code(), "unreviewed_version", "v1 left the shared tier");
}

/// A forge's audit entries and forge stats are written best effort (the forge stands when
/// the store refuses them), but not dropped: the next write that goes through carries them,
/// so a restart shows the trail and the stats this registry showed.
#[test]
fn audit_entries_and_forge_stats_a_failed_write_left_out_are_written_by_the_next_write() {
    let memory = Rc::new(MemoryStore::new());
    let store = Rc::new(SharedDataStore::new(memory.clone()));
    let r = rig_over("agent1", promo_config(), Some(approving_judge()), None, memory.clone(), store.clone());
    store.refuse_writes.set(true);
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    let rejected = block_on(r.registry.forge(&json!({ "name": "broken" }), "s1"));
    assert!(!rejected.success);
    store.refuse_writes.set(false);
    forge_ok(&r, "other", SLUGIFY_JS, "s1");
    let restarted = rig_over("agent1", promo_config(), Some(approving_judge()), None, memory, store);
    let actions = |r: &Rig| r.registry.audit_trail().iter().map(|e| format!("{} {}", e.action, e.tool)).collect::<Vec<_>>();
    assert_eq!(actions(&restarted), actions(&r));
    assert!(actions(&r).contains(&"forge slugify".to_string()) && actions(&r).contains(&"reject broken".to_string()));
    assert_eq!(restarted.registry.stats(), r.registry.stats());
    assert_eq!((r.registry.stats().unique_names, r.registry.stats().unique_approved), (3, 2));
}

/// The panel's verdicts are verdicts too: the trail keeps both reviewers' scores and reasoning
/// next to the promotion they decided, approved, refused, or let down by the tool changing
/// under review (which the trail records as well).
#[test]
fn a_promotions_panel_verdicts_and_how_it_ended_are_in_the_audit_trail() {
    let panel =
        judge_replying(vec![text(&verdict(true, 0.9, 0.9)), text(&verdict(false, 0.3, 0.9)), text(&verdict(true, 0.9, 0.9)), text(&verdict(true, 0.9, 0.9))]);
    let r = rig_with(promo_config(), Some(approving_judge()), Some(panel), Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    let since =
        |r: &Rig, n: usize| r.registry.audit_trail()[n..].iter().map(|e| format!("{} v{}: {}", e.action, e.version.unwrap_or(0), e.detail)).collect::<Vec<_>>();
    let n = r.registry.audit_trail().len();
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Rejected);
    let trail = since(&r, n);
    assert_eq!(trail.len(), 3, "{trail:?}");
    assert!(trail[0].starts_with("verdict v1: safety review: approved=true"), "{trail:?}");
    assert!(trail[1].starts_with("verdict v1: correctness review: approved=false"), "{trail:?}");
    assert!(trail[2].starts_with("promote v1: promotion rejected: the correctness reviewer rejected"), "{trail:?}");
    use_n(&r, "slugify", 2, "s1");
    let n = r.registry.audit_trail().len();
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
    let trail = since(&r, n);
    assert!(
        trail.len() == 3 && trail[0].starts_with("verdict v1: safety review: approved=true") && trail[1].starts_with("verdict v1: correctness review"),
        "{trail:?}"
    );
    assert!(trail[2].starts_with("promote v1: promoted session → agent"), "{trail:?}");

    // The panel approved a version forged over meanwhile: its verdicts and the refusal are kept.
    let r = rig_with(promo_config(), Some(approving_judge()), Some(approving_judge()), Rc::new(MemoryStore::new()));
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    let newer = slugify_request("slugify", &format!("{SLUGIFY_JS} // v2"));
    let (promoted, _) = block_on(futures::future::join(r.registry.request_promotion("slugify", Tier::Agent, "s1"), r.registry.forge(&newer, "s1")));
    assert_eq!(promoted.unwrap().status, PromotionStatus::Rejected);
    let trail = since(&r, 0);
    assert_eq!(trail.iter().filter(|e| e.starts_with("verdict v1: ") && e.contains(" review: ")).count(), 2, "{trail:?}");
    assert!(trail.last().is_some_and(|e| e.starts_with("promote v1: promotion rejected: the tool changed while the panel reviewed it")), "{trail:?}");
}

/// An operator's demotion out of the agent tier is not undone by the model forging the same
/// tool again in another session (or after a restart, where the tombstone is all that is left):
/// its uses do not promote it back by themselves. A request still may.
#[test]
fn the_same_tool_forged_again_elsewhere_after_a_demotion_is_not_promoted_back_by_its_uses() {
    let config = EmergentConfig { auto_promote: true, ..promo_config() };
    let store = Rc::new(MemoryStore::new());
    let panel = approving_judge();
    let r = rig_with(config.clone(), Some(approving_judge()), Some(panel.clone()), store.clone());
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(r.registry.list("s1")[0].tier, Tier::Agent, "promoted by its uses");
    block_on(r.registry.demote("slugify", "s1")).unwrap();
    let asked = panel.requests.borrow().len();
    forge_ok(&r, "slugify", SLUGIFY_JS, "s2");
    use_n(&r, "slugify", 6, "s2");
    assert_eq!(panel.requests.borrow().len(), asked, "the panel is not asked");
    // After a restart too.
    let panel = approving_judge();
    let r = rig_with(config, Some(approving_judge()), Some(panel.clone()), store);
    forge_ok(&r, "slugify", SLUGIFY_JS, "s3");
    use_n(&r, "slugify", 6, "s3");
    assert_eq!(panel.requests.borrow().len(), 0, "the panel is not asked after a restart");
    // Another version is promoted by its uses, and a request may promote the demoted one.
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, "s3")).unwrap().status, PromotionStatus::Promoted);
    block_on(r.registry.demote("slugify", "s3")).unwrap();
    forge_ok(&r, "slugify", SLUGIFY_V2_JS, "s4");
    use_n(&r, "slugify", 3, "s4");
    assert_eq!(r.registry.list("s4").into_iter().find(|t| t.status == ToolStatus::Active).unwrap().tier, Tier::Agent, "a new version is");
}

#[test]
fn a_shared_tool_another_agent_demotes_replaces_a_tombstone_in_its_owners_agent_tier() {
    let store = Rc::new(MemoryStore::new());
    // The owner's agent tier holds a tombstone of the name (a version it demoted there, say
    // from another tab): the tool it gets back must land there, not vanish from every tier.
    demoted_by_another_while_its_owner_is_closed(&store, |_| {
        let mut tombstone = block_on(store.get("shared/tool/slugify")).unwrap().unwrap();
        tombstone["data"]["tier"] = json!("agent");
        tombstone["data"]["status"] = json!("demoted");
        let older = &mut tombstone["data"]["history"].as_array_mut().unwrap()[0];
        older["version"] = json!(7);
        older["hash"] = json!("0".repeat(64));
        block_on(store.batch(vec![BatchOp::Put { key: "agent/agent1/tool/slugify".into(), value: tombstone }])).unwrap();
    });
    let reopened = rig_for("agent1", promo_config(), Some(approving_judge()), None, store);
    let listed = reopened.registry.list("s9");
    let tool = listed.iter().find(|t| t.name == "slugify").expect("the owner has its tool back");
    assert_eq!((tool.tier, tool.version), (Tier::Agent, 1));
    assert!(tool.versions.contains(&7), "the tombstone's versions stay in the history: {:?}", tool.versions);
    assert!(block_on(reopened.registry.call("slugify", json!({ "text": "Back Home" }), "s9")).is_ok(), "callable at the agent tier");
    let recorded = demotions(&reopened);
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert!(recorded[0].2.contains("demoted it from the shared tier to this agent's tier"), "{}", recorded[0].2);
}

#[test]
fn a_rejected_promotion_is_not_re_asked_for_the_same_content_forged_in_another_session_or_after_a_restart() {
    let no = text(&verdict(false, 0.3, 0.9));
    let panel = judge_replying(vec![no; 12]);
    // N = 3 uses promote, M = 5 more uses after a rejection before asking again.
    let config = EmergentConfig { auto_promote: true, promotion_retry_uses: 5, ..promo_config() };
    let store = Rc::new(MemoryStore::new());
    let r = rig_with(config.clone(), Some(approving_judge()), Some(panel.clone()), store.clone());
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    use_n(&r, "slugify", 3, "s1");
    assert_eq!(panel.requests.borrow().len(), 2, "the third use asks the panel, which says no");
    // The same content in another session: its N uses are not M more uses.
    forge_ok(&r, "slugify", SLUGIFY_JS, "s2");
    use_n(&r, "slugify", 4, "s2");
    assert_eq!(panel.requests.borrow().len(), 2, "the panel is not asked again before M uses");
    let out = block_on(r.registry.request_promotion("slugify", Tier::Agent, "s2")).unwrap();
    assert_eq!(out.status, PromotionStatus::Suppressed, "{out:?}");
    assert!(out.reason.contains("1 more successful uses"), "{}", out.reason);
    use_n(&r, "slugify", 1, "s2");
    assert_eq!(panel.requests.borrow().len(), 4, "asked again once M uses passed (and it says no again)");
    // After a restart over the same store, as well.
    r.registry.close();
    let restarted = rig_with(config, Some(approving_judge()), Some(panel.clone()), store);
    forge_ok(&restarted, "slugify", SLUGIFY_JS, "s3");
    use_n(&restarted, "slugify", 4, "s3");
    assert_eq!(panel.requests.borrow().len(), 4, "a restart does not forget the rejection");
    use_n(&restarted, "slugify", 1, "s3");
    assert_eq!(panel.requests.borrow().len(), 6);
    // A changed tool (another hash) is asked after N uses, as before.
    forge_ok(&restarted, "slugify", SLUGIFY_V2_JS, "s4");
    use_n(&restarted, "slugify", 3, "s4");
    assert_eq!(panel.requests.borrow().len(), 8);
}

/// A compose `wrap` whose one step `s` calls `slugify`.
fn wrap_request() -> serde_json::Value {
    json!({
        "name": "wrap", "description": "slugify through a pipeline",
        "inputSchema": { "type": "object", "properties": { "text": { "type": "string" } }, "required": ["text"] },
        "outputSchema": { "type": "object", "properties": { "slug": { "type": "string" } }, "required": ["slug"] },
        "implementation": { "mode": "compose", "steps": [{ "name": "s", "tool": "slugify", "inputMapping": { "text": "$input.text" } }] },
        "testCases": [{ "input": { "text": "A B" }, "expectedOutput": { "slug": "a-b" } }, { "input": { "text": "C" }, "expectedOutput": { "slug": "c" } }]
    })
}

/// A rig whose session `s1` holds `slugify` and `wrap` over it, each with the uses to promote.
fn wrap_rig(panel: Rc<support::ScriptedModel>, store: Rc<MemoryStore>) -> Rig {
    let r = rig_with(EmergentConfig { max_agent_tools: 5, ..promo_config() }, Some(approving_judge()), Some(panel), store);
    forge_ok(&r, "slugify", SLUGIFY_JS, "s1");
    assert!(block_on(r.registry.forge(&wrap_request(), "s1")).success);
    use_n(&r, "wrap", 3, "s1");
    r
}

#[test]
fn a_compose_tool_is_not_promoted_to_the_agent_tier_above_the_tools_its_steps_call() {
    let panel = approving_judge();
    let r = wrap_rig(panel.clone(), Rc::new(MemoryStore::new()));
    let out = block_on(r.registry.request_promotion("wrap", Tier::Agent, "s1")).unwrap();
    assert_eq!(out.status, PromotionStatus::Rejected, "{out:?}");
    assert!(out.reason.contains("step `s` calls `slugify`, which is only in session `s1`: promote it first"), "{}", out.reason);
    assert_eq!(panel.requests.borrow().len(), 0, "refused before the panel is asked");
    assert!(r.registry.list("s2").is_empty(), "nothing another session would fail to call");
    // Once its step tool is promoted, it may follow, and works from another session.
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
    assert_eq!(block_on(r.registry.request_promotion("wrap", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
    assert_eq!(block_on(r.registry.call("wrap", json!({ "text": "Hello There" }), "s2")).unwrap(), json!({ "slug": "hello-there" }));
}

#[test]
fn a_compose_tool_is_not_promoted_to_the_shared_tier_above_the_forged_tools_its_steps_call() {
    let store = Rc::new(MemoryStore::new());
    let r = wrap_rig(approving_judge(), store.clone());
    for name in ["slugify", "wrap"] {
        assert_eq!(block_on(r.registry.request_promotion(name, Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
    }
    let out = block_on(r.registry.request_promotion("wrap", Tier::Shared, "s1")).unwrap();
    assert_eq!(out.status, PromotionStatus::Rejected, "{out:?}");
    assert!(out.reason.contains("step `s` calls `slugify`, which is only at this agent's tier: promote it to the shared tier first"), "{}", out.reason);
    assert!(r.registry.pending_approvals().is_empty(), "no human is asked");
    // With its step tool shared first, it may follow; another agent then calls it.
    let approve = |name: &str| {
        let asked = block_on(r.registry.request_promotion(name, Tier::Shared, "s1")).unwrap();
        block_on(r.registry.approve(&asked.approval.unwrap().id))
    };
    approve("slugify").unwrap();
    approve("wrap").unwrap();
    let other = rig_for("agent2", promo_config(), Some(approving_judge()), None, store.clone());
    assert_eq!(block_on(other.registry.call("wrap", json!({ "text": "Hello There" }), "x")).unwrap(), json!({ "slug": "hello-there" }));
}

#[test]
fn approving_a_compose_tool_whose_step_tool_left_the_shared_tier_since_the_request_is_refused() {
    let r = wrap_rig(approving_judge(), Rc::new(MemoryStore::new()));
    for name in ["slugify", "wrap"] {
        assert_eq!(block_on(r.registry.request_promotion(name, Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
    }
    let asked = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap();
    block_on(r.registry.approve(&asked.approval.unwrap().id)).unwrap();
    let asked = block_on(r.registry.request_promotion("wrap", Tier::Shared, "s1")).unwrap();
    assert_eq!(asked.status, PromotionStatus::Pending, "{asked:?}");
    assert_eq!(block_on(r.registry.demote("slugify", "s1")).unwrap().tier, Tier::Agent);
    let err = block_on(r.registry.approve(&asked.approval.unwrap().id)).unwrap_err();
    assert!(err.to_string().contains("step `s` calls `slugify`, which is only at this agent's tier"), "{err}");
    let wrap = r.registry.list("s2").into_iter().find(|t| t.name == "wrap" && t.status == ToolStatus::Active).unwrap();
    assert_eq!(wrap.tier, Tier::Agent, "it stays where its step tool is");
}

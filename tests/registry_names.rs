//! Tool names as the agent serves them: a forged tool is never a look-alike of the agent's own
//! tools (ignoring case and `-` vs `_`), nor of another forged tool, and a shared pipeline
//! never rebinds to another agent's own tool of a step's name.

mod support;

use std::cell::Cell;
use std::rc::Rc;

use crucible::registry::{EmergentConfig, PromotionStatus, PromotionThreshold, Tier};
use crucible::store::MemoryStore;
use crucible::tools::{Tool, ToolSet};
use futures::executor::block_on;
use serde_json::{json, Value};
use support::emergent::*;
use support::FnTool;

fn promo_config() -> EmergentConfig {
    EmergentConfig { promotion_threshold: PromotionThreshold { uses: 3, confidence: 0.8 }, auto_promote: false, ..Default::default() }
}

fn forge(r: &Rig, request: &Value, session: &str) -> crucible::forge::ForgeResult {
    block_on(r.registry.forge(request, session))
}

/// Moves `name` from session `s1` of `r` to the shared tier, as an operator approving it would.
fn share(r: &Rig, name: &str, input: Value) {
    for _ in 0..3 {
        block_on(r.registry.call(name, input.clone(), "s1")).unwrap();
    }
    let to_agent = block_on(r.registry.request_promotion(name, Tier::Agent, "s1")).unwrap();
    assert_eq!(to_agent.status, PromotionStatus::Promoted, "{to_agent:?}");
    let approval = block_on(r.registry.request_promotion(name, Tier::Shared, "s1")).unwrap().approval.unwrap();
    block_on(r.registry.approve(&approval.id)).unwrap();
}

/// Forges `name` as a slugifier in `session` of `r`, uses it enough, and promotes it to the
/// agent tier.
fn promote_to_agent(r: &Rig, name: &str, session: &str) {
    assert!(forge(r, &slugify_request(name, SLUGIFY_JS), session).success);
    for _ in 0..3 {
        block_on(r.registry.call(name, json!({ "text": "A b" }), session)).unwrap();
    }
    let promoted = block_on(r.registry.request_promotion(name, Tier::Agent, session)).unwrap();
    assert_eq!(promoted.status, PromotionStatus::Promoted, "{promoted:?}");
}

/// Agent `agent_id` of `store`, with no host tools, whose agent tier holds `name` (promoted from
/// session `s1`).
fn agent_holding(store: &Rc<MemoryStore>, agent_id: &str, name: &str) -> Rig {
    let r = rig_for(agent_id, promo_config(), Some(approving_judge()), Some(approving_judge()), store.clone());
    r.registry.set_host_tools(ToolSet::new());
    promote_to_agent(&r, name, "s1");
    r
}

/// Agent A of `store`, which has no host tools (so `name` is a name of its own there), with
/// `name` forged as a slugifier in session `s1`; `pipelines` are forged over it before it is
/// shared (agent tier, then the shared tier by approval).
fn agent_a_sharing(store: &Rc<MemoryStore>, name: &str, pipelines: &[Value]) -> Rig {
    let a = rig_for("agent_a", promo_config(), Some(approving_judge()), Some(approving_judge()), store.clone());
    a.registry.set_host_tools(ToolSet::new());
    assert!(forge(&a, &slugify_request(name, SLUGIFY_JS), "s1").success);
    for pipeline in pipelines {
        assert!(forge(&a, pipeline, "s1").success);
    }
    share(&a, name, json!({ "text": "A b" }));
    a
}

/// A host tool `name` {text} → {text} that counts its calls (a real side effect).
fn counting_host_tool(name: &str, calls: Rc<Cell<u32>>) -> ToolSet {
    let text = json!({ "type": "object", "properties": { "text": { "type": "string" } }, "required": ["text"] });
    let handler = FnTool::new(move |a| {
        calls.set(calls.get() + 1);
        Ok(json!({ "text": a["text"].clone() }))
    });
    let mut set = ToolSet::new();
    set.insert(Tool::new(name, "Sends a real email", &text, Some(&text), handler).unwrap());
    set
}

/// A pipeline `name` whose one step calls `tool` with the input text, giving its `slug`.
fn slug_pipeline(name: &str, tool: &str) -> Value {
    json!({
        "name": name, "description": "Notifies",
        "inputSchema": { "type": "object", "properties": { "text": { "type": "string" } }, "required": ["text"] },
        "outputSchema": { "type": "object", "properties": { "slug": { "type": "string" } }, "required": ["slug"] },
        "implementation": { "mode": "compose", "steps": [{ "name": "s", "tool": tool, "inputMapping": { "text": "$input.text" } }] },
        "testCases": [{ "input": { "text": "Hello World" }, "expectedOutput": { "slug": "hello-world" } }, { "input": { "text": "a b" } }]
    })
}

#[test]
fn look_alikes_of_the_agents_own_tools_and_of_forge_tool_are_refused() {
    let r = rig();
    for name in ["Upper_Case", "upper-case", "UPPER_CASE", "Word-Count", "Forge_Tool", "forge-tool", "FORGE_TOOL"] {
        let res = forge(&r, &slugify_request(name, SLUGIFY_JS), "s1");
        assert!(!res.success, "{name}: {res:?}");
        let reason = res.reason.as_deref().unwrap_or_default().to_string();
        assert!(reason.contains("too close to") && reason.contains("one of the agent's own tools"), "{name}: {reason}");
    }
    assert!(r.registry.list("s1").is_empty());
    assert!(forge(&r, &slugify_request("upper_case_slug", SLUGIFY_JS), "s1").success, "a name of its own is fine");
}

#[test]
fn another_agents_shared_look_alike_of_an_own_tool_is_neither_offered_nor_called() {
    let store = Rc::new(MemoryStore::new());
    // Agent A has no `upper_case` of its own: `Upper_Case` is a name of its own there.
    let a = agent_a_sharing(&store, "Upper_Case", &[]);
    // Agent B serves its own `upper_case`: the look-alike would be offered beside it.
    let b = rig_for("agent_b", promo_config(), Some(approving_judge()), None, store);
    let offered = b.registry.tool_set("s1");
    assert!(offered.contains("upper_case") && !offered.contains("Upper_Case"), "{:?}", offered.names().collect::<Vec<_>>());
    let err = block_on(b.registry.call("Upper_Case", json!({ "text": "A b" }), "s1")).unwrap_err();
    assert_eq!(err.code, "unknown_tool", "{err:?}");
    assert!(err.message.contains("too close to this agent's own tool `upper_case`"), "{err:?}");
    assert!(b.registry.list("s1").iter().all(|t| t.name != "Upper_Case"), "nothing reaches it, so it is not listed");
    // What the agent serves under the name is its own tool: the look-alike is not its to hand
    // out, demote or roll back.
    for err in [
        b.registry.export("Upper_Case", "s1").unwrap_err(),
        block_on(b.registry.demote("Upper_Case", "s1")).unwrap_err(),
        block_on(b.registry.rollback("Upper_Case", 1, "s1")).unwrap_err(),
    ] {
        assert_eq!(err.code(), "tool_not_found", "{err}");
        // It says which own tool the name is taken for, not that it is one.
        assert!(err.to_string().starts_with("`Upper_Case` is too close to `upper_case`, one of the agent's own tools"), "{err}");
    }
    // Agent A still reaches it.
    assert!(a.registry.tool_set("s1").contains("Upper_Case"));
}

#[test]
fn forged_tools_differing_only_in_case_or_dashes_are_one_name() {
    let r = rig();
    assert!(forge(&r, &slugify_request("make_slug", SLUGIFY_JS), "s1").success);
    for name in ["Make_Slug", "make-slug", "MAKE-SLUG"] {
        let res = forge(&r, &slugify_request(name, SLUGIFY_V2_JS), "s1");
        assert!(!res.success, "{name}: {res:?}");
        assert!(res.reason.as_deref().unwrap_or_default().contains("too close to the existing tool `make_slug`"), "{name}: {res:?}");
    }
    // The exact name makes a new version, and another session does not see the first one.
    assert!(forge(&r, &slugify_request("make_slug", SLUGIFY_V2_JS), "s1").success);
    assert!(forge(&r, &slugify_request("Make_Slug", SLUGIFY_JS), "s2").success);
}

#[test]
fn a_shared_pipeline_never_rebinds_its_forged_step_to_another_agents_own_tool() {
    let store = Rc::new(MemoryStore::new());
    // Agent A forges `send_email` (it only slugifies a draft) and `notify` over it.
    let a = agent_a_sharing(&store, "send_email", &[slug_pipeline("notify", "send_email")]);
    share(&a, "notify", json!({ "text": "A b" }));
    assert_eq!(block_on(a.registry.call("notify", json!({ "text": "Hi there" }), "s1")).unwrap(), json!({ "slug": "hi-there" }));
    // Agent B's own `send_email` sends real mail: `notify` must not reach it.
    let b = rig_for("agent_b", promo_config(), Some(approving_judge()), None, store);
    let sent = Rc::new(Cell::new(0));
    b.registry.set_host_tools(counting_host_tool("send_email", sent.clone()));
    assert!(!b.registry.tool_set("s1").contains("notify"));
    for err in [
        block_on(b.registry.call("notify", json!({ "text": "Hi" }), "s1")).unwrap_err(),
        block_on(b.registry.call_at("notify", Tier::Shared, json!({ "text": "Hi" }), "s1")).unwrap_err(),
    ] {
        assert_eq!(err.code, "denied", "{err:?}");
        assert!(err.message.contains("its step tool `send_email` is a forged tool, which this agent's own tool `send_email` shadows"), "{err:?}");
    }
    // A pipeline over `notify` is not offered either, and its call does not reach the mail.
    let outer = forge(&b, &slug_pipeline("outer", "notify"), "s1");
    assert!(!outer.success, "{outer:?}");
    assert_eq!(sent.get(), 0, "no email was sent");
    // B's own tool answers B's calls of its name, and a look-alike own tool shadows as well.
    assert_eq!(block_on(b.registry.call("send_email", json!({ "text": "Hi" }), "s1")).unwrap(), json!({ "text": "Hi" }));
    assert_eq!(sent.get(), 1);
    b.registry.set_host_tools(counting_host_tool("Send-Email", sent.clone()));
    assert!(!b.registry.tool_set("s1").contains("notify"));
    assert_eq!(block_on(b.registry.call("notify", json!({ "text": "Hi" }), "s1")).unwrap_err().code, "denied");
    // Without an own tool of the step's name, B runs the pipeline as approved.
    b.registry.set_host_tools(ToolSet::new());
    assert_eq!(block_on(b.registry.call("notify", json!({ "text": "Hi there" }), "s1")).unwrap(), json!({ "slug": "hi-there" }));
    assert_eq!(sent.get(), 1);
}

#[test]
fn a_pipeline_over_an_own_tool_that_a_forged_tool_of_its_name_shadows_is_not_forged() {
    let store = Rc::new(MemoryStore::new());
    agent_a_sharing(&store, "send_email", &[]);
    let b = rig_for("agent_b", promo_config(), Some(approving_judge()), None, store);
    let sent = Rc::new(Cell::new(0));
    b.registry.set_host_tools(counting_host_tool("send_email", sent));
    // Registered, it could not be called here: the forge says so rather than succeed.
    let res = forge(&b, &slug_pipeline("notify", "send_email"), "s1");
    assert!(!res.success, "{res:?}");
    assert!(res.reason.as_deref().unwrap_or_default().contains("its own tool `send_email` shadows it"), "{res:?}");
    // Steps naming a tool no tier holds forged are bound to the own tool, as before.
    let relay = json!({
        "name": "relay", "description": "relay",
        "inputSchema": { "type": "object", "properties": { "text": { "type": "string" } }, "required": ["text"] },
        "outputSchema": { "type": "object", "properties": { "text": { "type": "string" } }, "required": ["text"] },
        "implementation": { "mode": "compose", "steps": [{ "name": "s", "tool": "upper_case", "inputMapping": { "text": "$input.text" } }] },
        "testCases": [{ "input": { "text": "a" }, "expectedOutput": { "text": "A" } }, { "input": { "text": "b" } }]
    });
    b.registry.set_host_tools(host_tools());
    let res = forge(&b, &relay, "s1");
    assert!(res.success, "{res:?}");
    assert_eq!(block_on(b.registry.call("relay", json!({ "text": "x" }), "s1")).unwrap(), json!({ "text": "X" }));
}

#[test]
fn a_host_tool_named_like_forge_tool_is_refused_when_emergent_is_enabled() {
    for name in ["forge_tool", "Forge-Tool", "FORGE_TOOL"] {
        let r = rig();
        r.registry.set_host_tools(counting_host_tool(name, Rc::default()));
        let reason = r.registry.refuse_reserved_host_tools().unwrap_err();
        assert!(reason.contains(&format!("tool name `{name}` is reserved for the `forge_tool` meta-tool")), "{reason}");
        let disabled = rig_with(EmergentConfig { enabled: false, ..Default::default() }, None, None, Rc::new(MemoryStore::new()));
        disabled.registry.set_host_tools(counting_host_tool(name, Rc::default()));
        assert_eq!(disabled.registry.refuse_reserved_host_tools(), Ok(()), "without the meta-tool the name is free");
    }
    assert_eq!(rig().registry.refuse_reserved_host_tools(), Ok(()));
}

#[test]
fn names_fold_alike_exactly_when_their_canonical_forms_are_equal() {
    use crucible::registry::{canonical_tool_name, same_tool_name};
    let names = ["send_email", "Send-Email", "SEND_EMAIL", "send-emails", "sendemail", "café", "CAFÉ", "Café", "a-b", "a_b", "A_B", "ab", ""];
    for a in names {
        for b in names {
            assert_eq!(same_tool_name(a, b), canonical_tool_name(a) == canonical_tool_name(b), "{a:?} vs {b:?}");
        }
    }
}

#[test]
fn a_pipeline_whose_later_step_tool_was_demoted_out_of_reach_runs_none_of_its_steps() {
    let r = rig_for("agent", promo_config(), Some(approving_judge()), Some(approving_judge()), Rc::new(MemoryStore::new()));
    let logged = Rc::new(Cell::new(0));
    r.registry.set_host_tools(counting_host_tool("log_text", logged.clone()));
    promote_to_agent(&r, "make_slug", "s1");
    // Session s2 forges a pipeline over the host tool (a side effect) and the agent tier's slugifier.
    let mut pipeline = slug_pipeline("log_then_slug", "log_text");
    pipeline["implementation"]["steps"] = json!([
        { "name": "log", "tool": "log_text", "inputMapping": { "text": "$input.text" } },
        { "name": "slug", "tool": "make_slug", "inputMapping": { "text": "$prev.text" } }
    ]);
    assert!(forge(&r, &pipeline, "s2").success);
    assert_eq!(block_on(r.registry.call("log_then_slug", json!({ "text": "Hi there" }), "s2")).unwrap(), json!({ "slug": "hi-there" }));
    let before = logged.get();
    // Demoted into session s1, the slugifier is out of s2's reach.
    block_on(r.registry.demote("make_slug", "s1")).unwrap();
    let err = block_on(r.registry.call("log_then_slug", json!({ "text": "Hi" }), "s2")).unwrap_err();
    assert_eq!(err.code, "unknown_tool", "{err:?}");
    assert!(err.message.contains("step `slug` (make_slug)"), "{err:?}");
    assert_eq!(logged.get(), before, "the first step's side effect did not happen for a call that could not finish");
}

#[test]
fn another_agents_shared_look_alike_of_an_agents_own_forged_tool_is_neither_offered_nor_called() {
    let store = Rc::new(MemoryStore::new());
    // Agent B has its own `report`, at its agent tier.
    let b = agent_holding(&store, "agent_b", "report");
    // Agent A, which cannot see B's tools (nor can the human approving it), shares `Report`.
    let _a = agent_a_sharing(&store, "Report", &[]);
    block_on(b.registry.reload_shared()).unwrap();
    for session in ["s1", "s2"] {
        let offered = b.registry.tool_set(session);
        assert!(offered.contains("report") && !offered.contains("Report"), "{session}: {:?}", offered.names().collect::<Vec<_>>());
        let err = block_on(b.registry.call("Report", json!({ "text": "A b" }), session)).unwrap_err();
        assert_eq!(err.code, "unknown_tool", "{err:?}");
        assert!(err.message.contains("too close to this session's `report`"), "{err:?}");
    }
}

#[test]
fn a_look_alike_is_not_promoted_beside_a_tool_of_the_tier_above() {
    let store = Rc::new(MemoryStore::new());
    // The shared tier: agent C's `FMT`, asked for before agent A shared `fmt`, is refused then.
    let c = agent_holding(&store, "agent_c", "FMT");
    let approval = block_on(c.registry.request_promotion("FMT", Tier::Shared, "s1")).unwrap().approval.unwrap();
    let _a = agent_a_sharing(&store, "fmt", &[]);
    let err = block_on(c.registry.approve(&approval.id)).unwrap_err();
    assert_eq!(err.code(), "invalid_promotion", "{err}");
    assert!(err.to_string().contains("already has `fmt`"), "{err}");

    // The agent tier: session s2's `Make_Slug`, forged while the tier had no `make_slug`.
    let r = rig_for("agent", promo_config(), Some(approving_judge()), Some(approving_judge()), Rc::new(MemoryStore::new()));
    r.registry.set_host_tools(ToolSet::new());
    assert!(forge(&r, &slugify_request("Make_Slug", SLUGIFY_JS), "s2").success);
    assert!(forge(&r, &slugify_request("make_slug", SLUGIFY_V2_JS), "s1").success);
    for (name, session) in [("make_slug", "s1"), ("Make_Slug", "s2")] {
        for _ in 0..3 {
            block_on(r.registry.call(name, json!({ "text": "A b" }), session)).unwrap();
        }
    }
    assert_eq!(block_on(r.registry.request_promotion("make_slug", Tier::Agent, "s1")).unwrap().status, PromotionStatus::Promoted);
    // s2 is offered its own session tool, not the agent tier's look-alike.
    let offered = r.registry.tool_set("s2");
    assert!(offered.contains("Make_Slug") && !offered.contains("make_slug"), "{:?}", offered.names().collect::<Vec<_>>());
    let refused = block_on(r.registry.request_promotion("Make_Slug", Tier::Agent, "s2")).unwrap();
    assert_eq!(refused.status, PromotionStatus::Rejected, "{refused:?}");
    assert!(refused.reason.contains("the agent tier already has `make_slug`"), "{refused:?}");
}

#[test]
fn another_agent_lists_and_exports_a_shared_tool_without_the_session_and_scope_it_was_forged_in() {
    let store = Rc::new(MemoryStore::new());
    let a = agent_a_sharing(&store, "fmt", &[]);
    let b = rig_for("agent_b", promo_config(), Some(approving_judge()), None, store);
    let listed = |r: &Rig| r.registry.list("s9").into_iter().find(|t| t.name == "fmt" && t.tier == Tier::Shared).unwrap();
    assert_eq!(listed(&a).session_id.as_deref(), Some("s1"), "the owner sees its own session");
    assert_eq!(listed(&b).session_id, None);
    let package = b.registry.export("fmt", "s9").unwrap();
    assert!(package.contains("agentId: agent_a"), "{package}");
    assert!(!package.contains("sessionId: s1"), "{package}");
    assert!(a.registry.export("fmt", "s1").unwrap().contains("sessionId: s1"), "the owner's export keeps it");
}

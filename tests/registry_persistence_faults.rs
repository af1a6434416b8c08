//! Registry persistence under store faults: audit entries dropped while writes were refused,
//! records this build cannot read (malformed, or written by a newer runtime), and what happens
//! meanwhile to a write still out (a close, calls, a flush).

mod support;

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crucible::agent::NativeEnvironment;
use crucible::registry::{EmergentConfig, Judges, PromotionStatus, PromotionThreshold, Registry, RegistryDeps, RegistryError, Tier};
use crucible::store::{MemoryStore, Store};
use futures::executor::{block_on, LocalPool};
use futures::task::LocalSpawnExt;
use serde_json::{json, Value};
use support::emergent::*;

const CAPACITY: usize = 3;

fn forge_ok(r: &Rig, name: &str) {
    // A session of its own each: the forges here would pass `maxSessionTools` in one.
    let res = block_on(r.registry.forge(&slugify_request(name, SLUGIFY_JS), name));
    assert!(res.success, "{res:?}");
}

fn stored_audit_entries(memory: &MemoryStore) -> usize {
    block_on(memory.scan("agent/agent1/audit/")).unwrap().len()
}

#[test]
fn audit_entries_dropped_while_writes_were_refused_are_deleted_by_the_next_write_that_succeeds() {
    let memory = Rc::new(MemoryStore::new());
    let store = Rc::new(SharedDataStore::new(memory.clone()));
    let config = EmergentConfig { audit_capacity: CAPACITY, ..Default::default() };
    let r = rig_over("agent1", config, Some(approving_judge()), None, memory.clone(), store.clone());
    forge_ok(&r, "t0");
    assert_eq!(stored_audit_entries(&memory), CAPACITY);
    // Several periods of refused writes, each pushing every stored entry out of the ring: the
    // store must not keep one more ring's worth per period.
    for period in 1..=4 {
        store.refuse_writes.set(true);
        forge_ok(&r, &format!("refused{period}"));
        forge_ok(&r, &format!("refused{period}b"));
        store.refuse_writes.set(false);
        forge_ok(&r, &format!("after{period}"));
        assert_eq!(r.registry.audit_trail().len(), CAPACITY);
        assert_eq!(stored_audit_entries(&memory), CAPACITY, "after refused-write period {period} the store holds the ring, no more");
    }
    // What the store holds is the ring memory holds.
    let stored: Vec<Value> = block_on(memory.scan("agent/agent1/audit/")).unwrap().into_iter().map(|(_, v)| v["data"]["tool"].clone()).collect();
    let kept: Vec<Value> = r.registry.audit_trail().into_iter().map(|e| json!(e.tool)).collect();
    assert_eq!(stored, kept);
}

/// Loads agent `agent_id` over `store`, returning the error a load gives.
fn load_error(store: Rc<MemoryStore>, agent_id: &str) -> RegistryError {
    let deps = RegistryDeps { store, env: Rc::new(NativeEnvironment::default()), sandbox: None, judges: Judges::default() };
    match block_on(Registry::load(EmergentConfig::default(), deps, agent_id)) {
        Ok(_) => panic!("agent `{agent_id}` loaded over an unreadable record"),
        Err(e) => e,
    }
}

fn store_with(key: &str, value: Value) -> Rc<MemoryStore> {
    let store = Rc::new(MemoryStore::new());
    block_on(store.put(key, value)).unwrap();
    store
}

#[test]
fn a_record_written_by_a_newer_runtime_is_reported_as_such_even_when_its_data_changed_shape() {
    let store = store_with("agent/agent1/tool/x", json!({ "kind": "tool", "v": 2, "data": { "renamed": true } }));
    let err = load_error(store, "agent1");
    assert_eq!(err.code(), "store_corrupt");
    let message = err.to_string();
    assert!(message.contains("newer version of the runtime"), "{message}");
    assert!(message.contains("agent/agent1/tool/x") && message.contains("upgrade"), "names the key and what to do: {message}");
}

#[test]
fn a_record_of_another_kind_is_still_refused_before_its_data_is_read() {
    let store = store_with("agent/agent1/tool/x", json!({ "kind": "stats", "v": 1, "data": {} }));
    let message = load_error(store, "agent1").to_string();
    assert!(message.contains("a `stats` record where a `tool` record belongs"), "{message}");
}

#[test]
fn an_unreadable_shared_record_names_its_key_and_the_way_out_for_every_agent() {
    for (key, value) in
        [("shared/tool/x", json!({ "hello": 1 })), ("shared/stats/x", json!("nope")), ("shared/tool/y", json!({ "kind": "tool", "v": 1, "data": {} }))]
    {
        let store = store_with(key, value);
        for agent in ["agent1", "agent2"] {
            let err = load_error(store.clone(), agent);
            assert_eq!(err.code(), "store_corrupt", "{key}");
            let message = err.to_string();
            assert!(message.contains(&format!("`{key}`")), "names the key: {message}");
            assert!(message.contains("delete"), "says how to go on: {message}");
            assert!(message.contains("every agent"), "says why every agent stops: {message}");
        }
    }
}

#[test]
fn a_shared_record_of_a_newer_runtime_says_to_upgrade_and_is_left_as_it_is() {
    let newer = json!({ "kind": "tool", "v": 2, "data": { "renamed": true } });
    let store = store_with("shared/tool/x", newer.clone());
    let message = load_error(store.clone(), "agent1").to_string();
    assert!(message.contains("newer version of the runtime") && message.contains("upgrade"), "{message}");
    assert_eq!(block_on(store.get("shared/tool/x")).unwrap(), Some(newer), "a newer runtime's record is not touched");
}

// ---- writes still out when something else happens ------------------------------------------

fn lifecycle_config() -> EmergentConfig {
    EmergentConfig { promotion_threshold: PromotionThreshold { uses: 3, confidence: 0.8 }, auto_promote: false, stats_flush_every: 1000, ..Default::default() }
}

fn use_n(r: &Rig, name: &str, n: usize, session: &str) {
    for _ in 0..n {
        block_on(r.registry.call(name, json!({ "text": "A b" }), session)).unwrap();
    }
}

/// `slugify` forged in `session`, used 3 times and promoted to the agent tier.
fn promote_to_agent(r: &Rig, code: &str, session: &str) {
    assert!(block_on(r.registry.forge(&slugify_request("slugify", code), session)).success);
    use_n(r, "slugify", 3, session);
    assert_eq!(block_on(r.registry.request_promotion("slugify", Tier::Agent, session)).unwrap().status, PromotionStatus::Promoted);
}

/// An agent over a [`SharedDataStore`] whose `slugify` went to the agent tier from session `s1`.
fn rig_with_slugify_at_the_agent_tier() -> (Rc<MemoryStore>, Rc<SharedDataStore>, Rig) {
    let memory = Rc::new(MemoryStore::new());
    let store = Rc::new(SharedDataStore::new(memory.clone()));
    let r = rig_over("agent1", lifecycle_config(), Some(approving_judge()), Some(approving_judge()), memory.clone(), store.clone());
    promote_to_agent(&r, SLUGIFY_JS, "s1");
    (memory, store, r)
}

fn stored_calls(memory: &MemoryStore, key: &str) -> u64 {
    block_on(memory.get(key)).unwrap().map_or(0, |v| v["data"]["calls"].as_u64().unwrap())
}

#[test]
fn a_stats_flush_going_when_its_agent_closes_lands_before_the_close_ends() {
    let (memory, store, r) = rig_with_slugify_at_the_agent_tier();
    let approval = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    block_on(r.registry.approve(&approval.id)).unwrap();
    let before = stored_calls(&memory, "shared/stats/slugify");
    use_n(&r, "slugify", 3, "s1");
    // A flush (periodic, or a call's) is reading the shared totals when the app closes the agent.
    *store.slow_reads.borrow_mut() = Some("shared/stats/");
    let mut pool = LocalPool::new();
    let flushed = Rc::new(Cell::new(None));
    let closed = Rc::new(Cell::new(false));
    let (registry, done) = (r.registry.clone(), flushed.clone());
    pool.spawner().spawn_local(async move { done.set(Some(registry.flush_stats().await.map_err(|e| e.code()))) }).unwrap();
    pool.run_until_stalled();
    // `close()`: its own flush finds the calls taken, then it waits for the writes going.
    let (registry, done) = (r.registry.clone(), closed.clone());
    pool.spawner()
        .spawn_local(async move {
            registry.flush_stats().await.unwrap();
            registry.close_writes().await;
            done.set(true);
        })
        .unwrap();
    pool.run_until_stalled();
    assert!(!closed.get(), "the close waits for the flush that was going");
    store.gate.open();
    pool.run();
    assert_eq!(flushed.get(), Some(Ok(())), "the flush that began before the close is not cut off");
    assert!(closed.get());
    assert_eq!(stored_calls(&memory, "shared/stats/slugify"), before + 3, "the calls it had taken are in the store");
}

#[test]
fn calls_made_while_a_refused_rollback_was_written_are_kept_and_the_stored_count_never_goes_back() {
    let (memory, store, r) = rig_with_slugify_at_the_agent_tier();
    promote_to_agent(&r, SLUGIFY_V2_JS, "s2");
    use_n(&r, "slugify", 5, "s2");
    block_on(r.registry.flush_stats()).unwrap();
    let agent_calls = |r: &Rig| r.registry.list("s2").into_iter().find(|t| t.tier == Tier::Agent).map(|t| (t.version, t.stats.calls));
    assert_eq!(agent_calls(&r), Some((2, 3 + 5)), "its session's 3 uses, then 5");
    store.hold_next_batch.set(true);
    store.refuse_held.set(true);
    let mut pool = LocalPool::new();
    let rolled = Rc::new(RefCell::new(None));
    let (registry, done) = (r.registry.clone(), rolled.clone());
    pool.spawner()
        .spawn_local(async move { *done.borrow_mut() = Some(registry.rollback("slugify", 1, "s2").await.map(|_| ()).map_err(|e| e.code())) })
        .unwrap();
    pool.run_until_stalled();
    // Three calls of version 1 while the rollback's write is out, and a flush that writes them.
    for _ in 0..3 {
        pool.run_until(r.registry.call("slugify", json!({ "text": "A b" }), "s2")).unwrap();
    }
    pool.run_until(r.registry.flush_stats()).unwrap();
    assert_eq!(stored_calls(&memory, "agent/agent1/stats/slugify"), 11);
    store.gate.open();
    pool.run();
    assert_eq!(rolled.borrow_mut().take(), Some(Err("store_quota")));
    assert_eq!(agent_calls(&r), Some((2, 11)), "version 2 is back, with the calls made meanwhile");
    use_n(&r, "slugify", 1, "s2");
    block_on(r.registry.flush_stats()).unwrap();
    assert_eq!(stored_calls(&memory, "agent/agent1/stats/slugify"), 12, "the stored count goes on from 11, not back to 9");
}

#[test]
fn calls_made_while_a_refused_approval_was_written_are_kept_at_the_agent_tier() {
    let (memory, store, r) = rig_with_slugify_at_the_agent_tier();
    use_n(&r, "slugify", 2, "s1");
    let approval = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    store.hold_next_batch.set(true);
    store.refuse_held.set(true);
    let mut pool = LocalPool::new();
    let approved = Rc::new(RefCell::new(None));
    let (registry, done) = (r.registry.clone(), approved.clone());
    pool.spawner().spawn_local(async move { *done.borrow_mut() = Some(registry.approve(&approval.id).await.map(|_| ()).map_err(|e| e.code())) }).unwrap();
    pool.run_until_stalled();
    for _ in 0..4 {
        pool.run_until(r.registry.call("slugify", json!({ "text": "A b" }), "s1")).unwrap();
    }
    store.gate.open();
    pool.run();
    assert_eq!(approved.borrow_mut().take(), Some(Err("store_quota")));
    let tool = r.registry.list("s1").into_iter().find(|t| t.name == "slugify").unwrap();
    assert_eq!((tool.tier, tool.stats.calls), (Tier::Agent, 3 + 2 + 4), "the agent-tier tool, with the calls made while the approval was written");
    block_on(r.registry.flush_stats()).unwrap();
    assert_eq!(stored_calls(&memory, "agent/agent1/stats/slugify"), 9);
}

#[test]
fn an_agent_let_go_while_its_approval_waits_on_a_store_that_never_answers_holds_up_no_agent_after_it() {
    let (memory, store, first) = rig_with_slugify_at_the_agent_tier();
    let approval = block_on(first.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    // The approval's batch waits for an answer that never comes; it holds the shared-tier turn.
    store.hold_next_batch.set(true);
    let mut pool = LocalPool::new();
    let approved = Rc::new(RefCell::new(None));
    let (registry, done) = (first.registry.clone(), approved.clone());
    pool.spawner().spawn_local(async move { *done.borrow_mut() = Some(registry.approve(&approval.id).await.map(|_| ()).map_err(|e| e.code())) }).unwrap();
    pool.run_until_stalled();
    // `close()` gives up waiting for that write and frees the agent: the registry is let go.
    first.registry.let_go();
    pool.run_until_stalled();
    assert_eq!(approved.borrow_mut().take(), Some(Err("closed")), "the approval ends rather than waiting on");
    // The agent id opened again on the same store: its shared-tier changes are not held up.
    let second = rig_over("agent1", lifecycle_config(), Some(approving_judge()), Some(approving_judge()), memory.clone(), store.clone());
    let demoted = Rc::new(RefCell::new(None));
    let (registry, done) = (second.registry.clone(), demoted.clone());
    pool.spawner().spawn_local(async move { *done.borrow_mut() = Some(registry.demote("slugify", "s1").await.map(|t| t.tier).map_err(|e| e.code())) }).unwrap();
    pool.run_until_stalled();
    assert_eq!(demoted.borrow_mut().take(), Some(Ok(Tier::Session)), "the demotion does not wait for the turn the let-go approval held");
}

#[test]
fn an_approval_made_after_its_agent_closed_writes_nothing() {
    let (memory, _store, r) = rig_with_slugify_at_the_agent_tier();
    let approval = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    r.registry.close();
    let approved = block_on(r.registry.approve(&approval.id)).map(|t| t.tier).map_err(|e| e.code());
    assert_eq!(approved, Err("closed"));
    assert_eq!(block_on(memory.get("shared/tool/slugify")).unwrap(), None, "the records belong to whoever opens the agent id next");
}

#[test]
fn calls_other_agents_flushed_while_a_refused_approval_waited_are_not_taken_for_this_agents() {
    let (memory, store, r) = rig_with_slugify_at_the_agent_tier();
    let approval = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s1")).unwrap().approval.unwrap();
    block_on(r.registry.approve(&approval.id)).unwrap();
    let shared_before = stored_calls(&memory, "shared/stats/slugify");
    // A new version at the agent tier with 3 uses of its own, asked to go to the shared tier.
    promote_to_agent(&r, SLUGIFY_V2_JS, "s2");
    let approval = block_on(r.registry.request_promotion("slugify", Tier::Shared, "s2")).unwrap().approval.unwrap();
    // The approval reads the shared totals while another agent's flush adds 7 calls to them,
    // then its write is refused.
    *store.slow_reads.borrow_mut() = Some("shared/stats/");
    let mut pool = LocalPool::new();
    let approved = Rc::new(RefCell::new(None));
    let (registry, done) = (r.registry.clone(), approved.clone());
    pool.spawner().spawn_local(async move { *done.borrow_mut() = Some(registry.approve(&approval.id).await.map(|_| ()).map_err(|e| e.code())) }).unwrap();
    pool.run_until_stalled();
    let mut totals = block_on(memory.get("shared/stats/slugify")).unwrap().unwrap();
    for field in ["calls", "successes"] {
        totals["data"][field] = json!(totals["data"][field].as_u64().unwrap() + 7);
    }
    block_on(memory.put("shared/stats/slugify", totals)).unwrap();
    store.hold_next_batch.set(true);
    store.refuse_held.set(true);
    store.gate.open();
    pool.run();
    assert_eq!(approved.borrow_mut().take(), Some(Err("store_quota")));
    let agent_calls = r.registry.list("s2").into_iter().find(|t| t.tier == Tier::Agent).map(|t| t.stats.calls);
    assert_eq!(agent_calls, Some(3), "its own 3 uses, not the other agents' 7 besides");
    block_on(r.registry.flush_stats()).unwrap();
    assert_eq!(stored_calls(&memory, "agent/agent1/stats/slugify"), 3);
    assert_eq!(stored_calls(&memory, "shared/stats/slugify"), shared_before + 7);
}

//! Registry persistence under store faults: audit entries dropped while writes were refused,
//! and records this build cannot read (malformed, or written by a newer runtime).

mod support;

use std::rc::Rc;

use crucible::agent::NativeEnvironment;
use crucible::registry::{EmergentConfig, Judges, Registry, RegistryDeps, RegistryError};
use crucible::store::{MemoryStore, Store};
use futures::executor::block_on;
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

//! Reusing the realm is indistinguishable from a fresh context: nothing one execution changes
#![cfg(feature = "sandbox")]
//! is visible to the next.
mod support;
use crucible::sandbox::boa::{BoaRunner, SandboxLimits};
use crucible::sandbox::SandboxStatus;
use serde_json::json;
use support::*;

const POLLUTER: &str = r#"
let leakedLet = 1; var leakedVar = 2; function leakedFn(){}
function execute(){
  const attempts = [
    () => { Object.prototype.polluted = 1; },
    () => { Array.prototype.polluted = 1; },
    () => { Object.defineProperty(Array.prototype, 'polluted', { value: 1 }); },
    () => { Object.getPrototypeOf(async function(){}).polluted = 1; },
    () => { Object.getPrototypeOf(Object.getPrototypeOf([][Symbol.iterator]())).polluted = 1; },
    () => { Promise.prototype.then = function(){ console.log('hijacked'); }; },
    () => { JSON.stringify = () => 'hijacked'; },
    () => { String.prototype.toLowerCase = () => 'hijacked'; },
    () => { RegExp.prototype[Symbol.replace] = () => 'hijacked'; },
    () => { Error.prototype.name = 'hijacked'; },
    () => { console.log = () => {}; },
    () => { Object.prototype.__proto__ = { polluted: 1 }; },
    () => { ({}).__proto__.polluted = 1; },
    () => { Symbol.prototype.polluted = 1; },
  ];
  let changed = 0;
  for (const a of attempts) { try { a(); changed++; } catch (e) {} }
  // Leave work behind: promise jobs that would log during a later execution.
  const again = () => Promise.resolve().then(() => { console.log('leftover job'); again(); });
  again();
  return changed;
}"#;

const PROBE: &str = r#"
function execute(){
  return {
    leakedLet: typeof leakedLet, leakedVar: typeof leakedVar, leakedFn: typeof leakedFn,
    objectProto: Object.getOwnPropertyNames(Object.prototype).length,
    polluted: [({}).polluted, [].polluted, (async function(){}).polluted, 'x'.polluted],
    lower: 'ABC'.toLowerCase(), replaced: 'aXb'.replace(/X/, '-'), json: JSON.stringify({a:1}),
    errorName: new Error('m').name, then: typeof Promise.prototype.then,
  };
}"#;

fn probe_expected() -> serde_json::Value {
    json!({
        "leakedLet": "undefined", "leakedVar": "undefined", "leakedFn": "undefined",
        "objectProto": 12, "polluted": [null, null, null, null],
        "lower": "abc", "replaced": "a-b", "json": "{\"a\":1}", "errorName": "Error", "then": "function",
    })
}

#[test]
fn pollution_attempts_do_not_carry_over_to_the_next_execution() {
    let runner = runner();
    let before = run(&runner, PROBE, json!({}));
    assert_eq!(before.status, SandboxStatus::Ok, "{before:?}");
    let polluter = run(&runner, POLLUTER, json!({}));
    assert_ok(&polluter, json!(0));
    let after = run(&runner, PROBE, json!({}));
    assert_eq!(after.output, before.output, "{after:?}");
    assert!(after.logs.is_empty(), "leftover jobs ran: {:?}", after.logs);
    assert_still_healthy(&runner);
}

#[test]
fn reused_realm_matches_a_fresh_context_per_call() {
    let fresh = BoaRunner::new(SandboxLimits { reuse_realm: false, ..SandboxLimits::default() });
    let reused = runner();
    let _ = run(&reused, POLLUTER, json!({}));
    let a = run(&fresh, PROBE, json!({}));
    let b = run(&reused, PROBE, json!({}));
    assert_eq!(a.output, b.output);
    let mut expected = probe_expected();
    expected["objectProto"] = a.output.as_ref().unwrap()["objectProto"].clone();
    assert_ok(&b, expected);
}

#[test]
fn the_realm_is_deep_frozen() {
    let runner = runner();
    runner.warm().unwrap();
    assert!(runner.frozen_objects() > 500, "{}", runner.frozen_objects());
}

/// Everything guest code can reach from the global object, through properties, prototypes and
/// what accessors return, is frozen.
const UNFROZEN_PROBE: &str = r#"
function execute(){
  // The global object itself is out of reach (validation refuses its names): start from what
  // guest code names directly.
  const named = { Object, Array, String, Number, Boolean, Symbol, BigInt, Math, JSON, Reflect, Promise, Proxy, Map, Set, WeakMap, WeakSet, Date, RegExp,
    Error, TypeError, RangeError, SyntaxError, ReferenceError, EvalError, URIError, ArrayBuffer, DataView, Uint8Array, Float64Array, BigInt64Array,
    console, parseInt, parseFloat, isNaN, isFinite, encodeURIComponent, decodeURIComponent,
    // The guest's own functions are its own to change; what they inherit is not.
    fn: Object.getPrototypeOf(function(){}), asyncFn: Object.getPrototypeOf(async function(){}),
    gen: Object.getPrototypeOf(function*(){}), agen: Object.getPrototypeOf(async function*(){}) };
  const seen = new Set([named]), unfrozen = [], stack = Object.entries(named).map(([k, v]) => [v, k]);
  while (stack.length > 0) {
    const [o, path] = stack.pop();
    if ((typeof o !== 'object' && typeof o !== 'function') || o === null || seen.has(o)) continue;
    seen.add(o);
    if (!Object.isFrozen(o)) unfrozen.push(path);
    stack.push([Object.getPrototypeOf(o), path + '.[[Prototype]]']);
    for (const k of Reflect.ownKeys(o)) {
      const d = Object.getOwnPropertyDescriptor(o, k);
      const name = path + '.' + String(k);
      if ('value' in d) { stack.push([d.value, name]); continue; }
      stack.push([d.get, name + '.get'], [d.set, name + '.set']);
      try { stack.push([d.get && d.get.call(o), name + '()']); } catch (e) {}
    }
  }
  return { reached: seen.size, unfrozen: unfrozen.slice(0, 10) };
}"#;

#[test]
fn everything_reachable_from_guest_code_is_frozen_including_what_accessors_return() {
    let runner = runner();
    let r = run(&runner, UNFROZEN_PROBE, json!({}));
    let out = r.output.clone().unwrap_or_default();
    assert_eq!(out["unfrozen"], json!([]), "{r:?}");
    assert!(out["reached"].as_u64().unwrap_or(0) > 500, "{out}");
}

#[test]
fn a_tool_cannot_hook_a_tamed_intrinsic_to_watch_or_change_the_next_tools_calls() {
    // Tool A plants, tool B checks its (secret) input with hasOwnProperty, A collects.
    let planter = include_str!("fixtures/hook-planter.js");
    let victim = "function execute(input){ const out = {}; for (const k in input) if (Object.prototype.hasOwnProperty.call(input, k)) out[k] = typeof input[k]; return out; }";
    let runner = runner();
    assert_ok(&run(&runner, planter, json!("plant")), json!({ "planted": false, "frozen": true }));
    assert_ok(&run(&runner, victim, json!({ "apiKey": "sk-secret" })), json!({ "apiKey": "string" }));
    assert_ok(&run(&runner, planter, json!("collect")), json!("nothing"));
}

#[test]
fn closures_and_state_from_a_previous_execution_are_unreachable() {
    let runner = runner();
    let r = run(&runner, "let counter = 0; function execute(){ counter++; return counter; }", json!({}));
    assert_ok(&r, json!(1));
    let r = run(&runner, "let counter = 0; function execute(){ counter++; return counter; }", json!({}));
    assert_ok(&r, json!(1));
    let r = run(&runner, "function execute(){ return Symbol.for('k') === Symbol.for('k'); }", json!({}));
    assert_ok(&r, json!(true));
}

#[test]
fn cached_code_reruns_with_fresh_declarations() {
    let runner = runner();
    let code = "function helper(){} let n = 0; function execute(){ helper.count = (helper.count || 0) + 1; n++; execute.calls = (execute.calls || 0) + 1; return [helper.count, n, execute.calls]; }";
    for _ in 0..3 {
        assert_ok(&run(&runner, code, json!({})), json!([1, 1, 1]));
    }
}

#[test]
fn the_validation_cache_is_keyed_by_allowlist_too() {
    let runner = runner();
    let code = "function execute(){ return crypto.sha256(''); }";
    let r = run_with(&runner, code, json!({}), &["crypto"]);
    assert_eq!(r.status, SandboxStatus::Ok, "{r:?}");
    let r = run(&runner, code, json!({}));
    assert_status(&r, SandboxStatus::Rejected, "not_allowlisted");
}

#[test]
fn cached_code_is_keyed_by_allowlist_and_code_without_ambiguity() {
    let runner = runner();
    let body = "function execute(){ return 1; }";
    assert_ok(&run_with(&runner, &format!("//c\n{body}"), json!({}), &["fetch"]), json!(1));
    // Joined with a newline, this allowlist and code spell the same text as the pair above;
    // the allowlist entry is not a host API and must still be refused by validation.
    let r = run_with(&runner, body, json!({}), &["fetch\n//c"]);
    assert_status(&r, SandboxStatus::Rejected, "unknown_api");
}

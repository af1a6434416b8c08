//! The value converter: never runs guest code, bounded before allocating.
#![cfg(feature = "sandbox")]
mod support;
use crucible::sandbox::SandboxStatus;
use serde_json::json;
use support::*;

#[test]
fn getters_to_json_value_of_and_then_are_never_called() {
    let runner = runner();
    // Counters live in the input object; if any trap ran, a log line would appear.
    let r = run(&runner, "function execute(){ return { a: 1, toJSON(){ console.log('toJSON'); return 'x'; }, valueOf(){ console.log('valueOf'); return 2; }, then(r){ console.log('then'); r(3); } }; }", json!({}));
    assert_ok(&r, json!({"a": 1}));
    assert!(r.logs.is_empty(), "{:?}", r.logs);
    let r = run(&runner, "function execute(){ return { get secret(){ console.log('getter'); return 1; } }; }", json!({}));
    assert_status(&r, SandboxStatus::Error, "output");
    assert!(r.logs.is_empty());
    assert!(r.error.unwrap().message.contains("accessor"));
}

#[test]
fn proxies_are_refused_without_running_traps() {
    let r = run(
        &runner(),
        "function execute(){ const h = { ownKeys(){ console.log('trap'); return []; }, get(){ console.log('trap'); } }; return { p: new Proxy({}, h) }; }",
        json!({}),
    );
    assert_status(&r, SandboxStatus::Error, "output");
    assert!(r.logs.is_empty());
    assert!(r.error.unwrap().message.contains("Proxy"));
}

#[test]
fn thenable_returned_from_sync_execute_is_data() {
    let r = run(&runner(), "function execute(){ return { then: 5, x: 1 }; }", json!({}));
    assert_ok(&r, json!({"then": 5, "x": 1}));
}

#[test]
fn cycles_are_errors_and_dags_are_bounded_by_the_node_cap() {
    let runner = runner();
    let r = run(&runner, "function execute(){ const a = {}; a.self = a; return a; }", json!({}));
    assert_status(&r, SandboxStatus::Error, "output");
    assert!(r.error.unwrap().message.contains("cycle"));
    // A DAG whose expansion is 2^40 nodes: refused by the node cap, quickly.
    let r = run(&runner, "function execute(){ let x = [1]; for (let i = 0; i < 40; i++) x = [x, x]; return x; }", json!({}));
    assert_status(&r, SandboxStatus::Error, "output");
    // A small DAG is copied.
    let r = run(&runner, "function execute(){ const s = { v: 1 }; return [s, s]; }", json!({}));
    assert_ok(&r, json!([{"v": 1}, {"v": 1}]));
}

#[test]
fn huge_sparse_arrays_are_refused_before_allocating() {
    let r = run(&runner(), "function execute(){ const a = []; a.length = 2**32 - 1; return a; }", json!({}));
    assert_status(&r, SandboxStatus::Error, "output");
    assert!(r.error.unwrap().message.contains("length"));
    let r = run(&runner(), "function execute(){ const a = [1]; a[5] = 2; return a; }", json!({}));
    assert_ok(&r, json!([1, null, null, null, null, 2]));
}

#[test]
fn string_wrappers_and_typed_arrays_are_sized_before_their_keys_are_listed() {
    // Each index is a key: listing them first allocates them all (2e7 of them: ~160 MB, a
    // memory trap in the Worker) before the node limit has its say. Sizes here stay within the
    // test runner's loop budget; the message says which check refused them.
    let runner = runner();
    for value in ["Object('x'.repeat(5e5))", "new Uint8Array(5e5)"] {
        let r = run(&runner, &format!("function execute(){{ return {{ v: {value} }}; }}"), json!({}));
        assert_status(&r, SandboxStatus::Error, "output");
        assert!(r.error.as_ref().unwrap().message.contains("500000 indexed keys"), "{r:?}");
    }
    // Logging one is bounded the same way.
    let r = run(&runner, "function execute(){ console.log(new Uint8Array(5e5)); return 1; }", json!({}));
    assert_ok(&r, json!(1));
    assert_still_healthy(&runner);
    // Small ones convert as before: their indexed values are not own data properties.
    assert_ok(&run(&runner, "function execute(){ return [Object('ab'), new Uint8Array(2)]; }", json!({})), json!([{}, {}]));
}

#[test]
fn a_value_shared_many_times_over_is_refused_as_the_whole_output_being_too_large() {
    // Doubling one array 40 times: each array holds two elements, but the output would hold
    // 2^40 values. The message is about the output, not "an array of 2" being too long.
    let r = run(&runner(), "function execute(){ let v = [1]; for (let i = 0; i < 40; i++) v = [v, v]; return v; }", json!({}));
    assert_status(&r, SandboxStatus::Error, "output");
    let message = r.error.unwrap().message;
    assert!(message.contains("an array of length 2 would take the output past its limit of 200000 values"), "{message}");
    assert!(message.contains("so far)"), "{message}");
}

#[test]
fn deep_values_are_refused_by_the_depth_cap() {
    let r = run(&runner(), "function execute(){ let x = {}; for (let i = 0; i < 100000; i++) x = { x }; return x; }", json!({}));
    assert_status(&r, SandboxStatus::Error, "output");
    assert!(r.error.unwrap().message.contains("deeper"));
}

#[test]
fn huge_strings_are_refused_by_the_byte_cap() {
    let r = run(&runner(), "function execute(){ const s = 'x'.repeat(900000); return s + s + s + s + s + s; }", json!({}));
    assert_status(&r, SandboxStatus::Error, "output");
}

#[test]
fn the_byte_cap_counts_strings_and_keys_as_json_escapes_them() {
    // The cap is 4 MiB. 800,000 U+0001 characters are 0.8 MB of UTF-8 but 4.8 MB of JSON
    // (`\u0001` each), which is the text the host receives: refused, as a value or as a key.
    // (Repeat counts stay under the test runner's loop budget of a million.)
    let runner = runner();
    for value in [
        "'\\x01'.repeat(8e5)",
        "{ ['\\x01'.repeat(8e5)]: 1 }",
        "((a, b, c) => [a + a + a, b + b + b, c + c + c])('\\n'.repeat(3e5), '\"'.repeat(3e5), '\\\\'.repeat(3e5))",
    ] {
        let r = run(&runner, &format!("function execute(){{ return {value}; }}"), json!({}));
        // (Not `assert_status`: on failure it would print the megabytes of output.)
        let message = r.error.map(|e| e.message).unwrap_or_default();
        assert!(r.status == SandboxStatus::Error && message.contains("larger than 4194304 bytes"), "{value}: {:?} {message}", r.status);
    }
    // Numbers count as written: 199,000 long fractions are 5 MB of JSON (25 bytes each).
    let r = run(&runner, "function execute(){ return Array.from({ length: 199000 }, () => -1.2345678901234567e-300); }", json!({}));
    let message = r.error.map(|e| e.message).unwrap_or_default();
    assert!(r.status == SandboxStatus::Error && message.contains("larger than 4194304 bytes"), "{:?} {message}", r.status);
    // Under the cap once escaped (1.8 + 1.8 + 0.2 MB), and plain text up to the cap as before.
    let r = run(&runner, "function execute(){ return ['\\x01'.repeat(3e5), '\\n\"\\\\'.repeat(3e5), 'é'.repeat(1e5)]; }", json!({}));
    assert_ok(&r, json!(["\u{1}".repeat(300_000), "\n\"\\".repeat(300_000), "é".repeat(100_000)]));
    let r = run(&runner, "function execute(){ const s = 'x'.repeat(1 << 19); return s + s + s + s + s + s + s + s.slice(64); }", json!({}));
    assert_ok(&r, json!("x".repeat(4 * 1024 * 1024 - 64)));
}

#[test]
fn json_semantics_for_odd_values() {
    let r = run(&runner(), "function execute(){ return { u: undefined, f(){}, s: Symbol('x'), n: NaN, i: -Infinity, arr: [undefined, () => 1], [Symbol('k')]: 1, big: 2**60, neg0: -0, frac: 0.5 }; }", json!({}));
    assert_ok(&r, json!({"n": null, "i": null, "arr": [null, null], "big": 1152921504606846976.0, "neg0": 0, "frac": 0.5}));
    let r = run(&runner(), "function execute(){ return 10n; }", json!({}));
    assert_status(&r, SandboxStatus::Error, "output");
}

#[test]
fn proto_in_input_is_an_own_key_not_a_prototype() {
    let input: serde_json::Value = serde_json::from_str(r#"{"__proto__": {"polluted": true}, "a": 1}"#).unwrap();
    let r = run(
        &runner(),
        "function execute(i){ return [i.polluted === undefined, Object.getPrototypeOf(i) === Object.prototype, Object.keys(i), ({}).polluted === undefined]; }",
        input,
    );
    assert_ok(&r, json!([true, true, ["__proto__", "a"], true]));
}

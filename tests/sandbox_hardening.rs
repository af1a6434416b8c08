//! Runtime hardening holds even when static validation is bypassed (computed names, prototypes).
#![cfg(feature = "sandbox")]
mod support;
use crucible::sandbox::SandboxStatus;
use serde_json::json;
use support::*;

#[test]
fn string_compilation_is_denied_through_constructor_chains() {
    let runner = runner();
    for code in [
        "function execute(){ const F = (()=>{})['constr'+'uctor']; return F('return 1')(); }",
        "function execute(){ const F = Object.getPrototypeOf(async function(){})['constr'+'uctor']; return F('return 1'); }",
        "function execute(){ const F = Object.getPrototypeOf(function*(){})['constr'+'uctor']; return F('yield 1'); }",
        "function execute(){ const g = [].map['constr'+'uctor']; return g('return this')(); }",
        "function execute(){ const e = Reflect.get(Object.getPrototypeOf(Math.max), 'constr'+'uctor'); return Reflect.construct(e, ['return 1']); }",
    ] {
        let r = run(&runner, code, json!({}));
        assert_status(&r, SandboxStatus::Error, "compile_denied");
        assert!(r.error.unwrap().message.contains("string compilation"));
    }
    assert_still_healthy(&runner);
}

#[test]
fn removed_globals_and_the_global_object_are_unreachable_even_with_escapes() {
    // Unicode escapes resolve to the same identifier in Boa's parser, so they are caught too;
    // strict mode means `this` in a plain call is undefined, not the global object.
    for code in [
        "function execute(){ return typeof Sh\\u0061redArrayBuffer; }",
        "function execute(){ return typeof globalTh\\u0069s; }",
        "function execute(){ return typeof ev\\u0061l; }",
    ] {
        let r = run(&runner(), code, json!({}));
        assert_eq!(r.status, SandboxStatus::Rejected, "{code}: {r:?}");
    }
    let r = run(&runner(), "function execute(){ return [typeof (function(){ return this; })(), typeof WeakMap, typeof Proxy]; }", json!({}));
    assert_ok(&r, json!(["undefined", "function", "function"]));
}

#[test]
fn intrinsics_and_global_object_are_frozen() {
    let r = run(
        &runner(),
        r#"function execute(){
        const out = [];
        const tries = [
            () => { Object.prototype.polluted = 1; },
            () => { Array.prototype.push = null; },
            () => { JSON.parse = null; },
            () => { Object.getPrototypeOf(function*(){}).x = 1; },
            () => { Object.getPrototypeOf([][Symbol.iterator]()).next = null; },
            () => { Object.defineProperty(Object.prototype, 'y', { value: 1 }); },
            () => { Object.setPrototypeOf(Array.prototype, null); },
            () => { Math.random = () => 4; },
            () => { Object.getPrototypeOf(Uint8Array).prototype.x = 1; },
        ];
        for (const t of tries) { try { t(); out.push('mutated'); } catch (e) { out.push(e instanceof TypeError); } }
        return out;
    }"#,
        json!({}),
    );
    assert_ok(&r, json!([true, true, true, true, true, true, true, true, true]));
}

#[test]
fn loops_and_recursion_are_bounded() {
    let runner = runner();
    let r = run(&runner, "function execute(){ for(;;){} }", json!({}));
    assert_status(&r, SandboxStatus::Timeout, "loop_limit");
    assert_still_healthy(&runner);
    let r = run(&runner, "function execute(){ const f = (n) => f(n + 1) + 1; return f(0); }", json!({}));
    assert_status(&r, SandboxStatus::Error, "stack_overflow");
    assert_still_healthy(&runner);
}

#[test]
fn an_error_whose_text_reads_like_a_limit_is_not_taken_for_one() {
    let runner = runner();
    // The engine's own SyntaxError quotes the guest's string, which names the limits.
    for text in ["iteration loops", "recursive calls", "stack size"] {
        let r = run(&runner, &format!("function execute(){{ return BigInt({text:?}); }}"), json!({}));
        assert_status(&r, SandboxStatus::Error, "runtime_error");
        assert!(r.error.unwrap().message.contains(text), "the guest text is in the message");
    }
}

#[test]
fn promise_floods_and_async_infinite_loops_hit_the_job_budget() {
    let runner = runner();
    let r = run(&runner, "async function execute(){ for(;;) await 0; }", json!({}));
    assert_status(&r, SandboxStatus::Timeout, "job_budget");
    assert_still_healthy(&runner);
    let r = run(&runner, "async function execute(){ const p = () => Promise.resolve().then(p); p(); p(); await new Promise(()=>{}); }", json!({}));
    assert_eq!(r.status, SandboxStatus::Timeout, "{r:?}");
    assert_still_healthy(&runner);
}

#[test]
fn thenables_an_async_execute_resolves_to_are_bounded() {
    let runner = runner();
    // Resolves to itself for ever: each round is a promise job, so the job budget ends it.
    let r = run(&runner, "async function execute(){ const t = { then(r){ r(t); } }; return t; }", json!({}));
    assert_status(&r, SandboxStatus::Timeout, "job_budget");
    assert_still_healthy(&runner);
    // Never calls back: the run settles as never settling, it does not hang.
    let r = run(&runner, "async function execute(){ return { then(){} }; }", json!({}));
    assert_status(&r, SandboxStatus::Error, "never_settled");
    // Loops inside `then`: the loop limit.
    let r = run(&runner, "async function execute(){ return { then(){ for(;;){} } }; }", json!({}));
    assert_status(&r, SandboxStatus::Timeout, "loop_limit");
    assert_still_healthy(&runner);
    // An honest one resolves to its value.
    assert_ok(&run(&runner, "async function execute(){ return { then(r){ r({ ok: 1 }); } }; }", json!({})), json!({ "ok": 1 }));
}

#[test]
fn a_promise_that_never_settles_is_an_error_not_a_hang() {
    let r = run(&runner(), "function execute(){ return new Promise(() => {}); }", json!({}));
    assert_status(&r, SandboxStatus::Error, "never_settled");
}

#[test]
fn buffers_are_capped_by_the_memory_budget() {
    let r = run(&runner(), "function execute(){ return new ArrayBuffer(1024 * 1024 * 1024).byteLength; }", json!({}));
    assert_eq!(r.status, SandboxStatus::Error, "{r:?}");
    let r = run(&runner(), "function execute(){ return new ArrayBuffer(1024 * 1024).byteLength; }", json!({}));
    assert_ok(&r, json!(1048576));
}

#[test]
fn host_api_arguments_are_never_coerced_through_guest_code() {
    let runner = runner();
    let r = run_with(&runner, "function execute(){ let called = 0; const evil = { toString(){ called++; return 'x'; }, valueOf(){ called++; return 1; } }; try { crypto.sha256(evil); } catch (e) { return [called, e instanceof TypeError]; } }", json!({}), &["crypto"]);
    assert_ok(&r, json!([0, true]));
    let r = run_with(&runner, "async function execute(){ let called = 0; const init = { get method(){ called++; return fetch('https://a.example'); } }; try { await fetch('https://a.example', init); } catch (e) { return [called, e instanceof TypeError, e.message]; } }", json!({}), &["fetch"]);
    assert_eq!(r.status, SandboxStatus::Ok, "{r:?}");
    assert_eq!(r.output.as_ref().unwrap()[0], json!(0));
    assert_eq!(r.output.as_ref().unwrap()[1], json!(true));
}

#[test]
fn host_fetch_errors_arrive_as_fresh_guest_errors() {
    let r = run_with(&runner(), "async function execute(){ try { await fetch('https://a.example'); } catch (e) { return [e instanceof TypeError, Object.getPrototypeOf(e) === TypeError.prototype, e.message]; } }", json!({}), &["fetch"]);
    assert_ok(&r, json!([true, true, "fetch failed: fetch is not configured on this host"]));
}

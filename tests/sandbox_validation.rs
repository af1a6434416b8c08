//! Static validation rejects blocked constructs with readable reasons, before running anything.
#![cfg(feature = "sandbox")]
mod support;
use crucible::sandbox::SandboxStatus;
use serde_json::json;
use support::*;

fn rejected(code: &str) -> (String, String) {
    let r = run(&runner(), code, json!({}));
    assert_eq!(r.status, SandboxStatus::Rejected, "{code}: {r:?}");
    let e = r.error.unwrap();
    (e.code, e.message)
}

#[test]
fn eval_function_require_process_are_rejected_with_reasons() {
    for (code, needle) in [
        ("function execute(){ return eval('1'); }", "eval"),
        ("function execute(){ return new Function('return 1')(); }", "Function"),
        ("function execute(){ return require('fs'); }", "require"),
        ("function execute(){ return process.env; }", "process"),
        ("function execute(){ return globalThis.x; }", "globalThis"),
        ("function execute(){ return 'child_process'; }", "child_process"),
        ("function execute(){ return (()=>{}).constructor('return 1')(); }", "constructor"),
        ("function execute(){ return SharedArrayBuffer; }", "SharedArrayBuffer"),
        ("function execute(){ setTimeout(()=>{}, 1); }", "setTimeout"),
    ] {
        let (code_, message) = rejected(code);
        assert!(message.contains(needle), "{code} → {code_}: {message}");
    }
}

#[test]
fn dynamic_import_and_module_syntax_are_rejected() {
    assert_eq!(rejected("async function execute(){ return import('fs'); }").0, "dynamic_import");
    assert_eq!(rejected("import fs from 'fs'; function execute(){}").0, "module_syntax");
    assert_eq!(rejected("export function execute(){}").0, "module_syntax");
}

#[test]
fn opt_in_apis_need_the_allowlist() {
    let (code, message) = rejected("async function execute(){ return fetch('https://x'); }");
    assert_eq!(code, "not_allowlisted");
    assert!(message.contains("fetch"));
    assert_eq!(rejected("function execute(){ return crypto.sha256('a'); }").0, "not_allowlisted");
    let r = run_with(&runner(), "function execute(){ return 1; }", json!({}), &["shell"]);
    assert_status(&r, SandboxStatus::Rejected, "unknown_api");
}

#[test]
fn property_names_that_look_blocked_are_allowed() {
    let r = run(&runner(), "function execute(i){ const o = { process: 1, eval: 2 }; return o.process + o.eval + i.require; }", json!({"require": 3}));
    assert_ok(&r, json!(6));
}

#[test]
fn syntax_errors_are_rejected_readably() {
    let (code, message) = rejected("function execute( { return 1; }");
    assert_eq!(code, "syntax");
    assert!(message.starts_with("syntax error"), "{message}");
}

#[test]
fn deep_nesting_is_rejected_before_parsing() {
    // The wasm artifact has an 8 MiB stack (build.rs); give the parser the same here.
    std::thread::Builder::new().stack_size(8 << 20).spawn(deep_nesting_body).unwrap().join().unwrap();
}

fn deep_nesting_body() {
    for code in [
        format!("function execute(){{ return {}1{}; }}", "[".repeat(5000), "]".repeat(5000)),
        format!("function execute(){{ return {}1{}; }}", "(".repeat(5000), ")".repeat(5000)),
        format!("function execute(){{ return {}1; }}", "!".repeat(5000)),
        format!("function execute(){{ return {}1; }}", "a?".repeat(3000) + &":0".repeat(3000)),
        format!("function execute(){{ return {}1; }}", "x=>".repeat(3000)),
    ] {
        assert_eq!(rejected(&code).0, "too_deep");
    }
    // Legitimate moderate nesting still runs.
    let r = run(&runner(), &format!("function execute(){{ return {}1{}; }}", "[".repeat(30), "]".repeat(30)), json!({}));
    assert_eq!(r.status, SandboxStatus::Ok, "{r:?}");
}

#[test]
fn oversized_source_is_rejected() {
    let code = format!("function execute(){{ return 1; }} //{}", "x".repeat(300_000));
    assert_eq!(rejected(&code).0, "too_large");
}

#[test]
fn braces_inside_template_text_are_not_nesting_but_template_substitutions_are() {
    let r = runner();
    // 100 literal braces in template text: text, not nesting.
    let braces = "{".repeat(100);
    let code = format!("function execute(input) {{ return {{ s: `{braces} ${{input.a}} ${{`inner ${{input.a}}`}}` }}; }}");
    assert_ok(&run(&r, &code, json!({ "a": 1 })), json!({ "s": format!("{braces} 1 inner 1") }));
    // Substitutions nested past the limit are nesting, and are refused before parsing.
    let deep = (0..80).fold("input.a".to_string(), |inner, _| format!("`${{{inner}}}`"));
    let code = format!("function execute(input) {{ return {{ s: {deep} }}; }}");
    let (code_, reason) = rejected(&code);
    assert_eq!(code_, "too_deep", "{reason}");
}

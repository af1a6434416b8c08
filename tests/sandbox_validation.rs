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
fn a_quote_in_a_regex_literal_hides_no_brackets_from_the_nesting_count() {
    std::thread::Builder::new().stack_size(8 << 20).spawn(regex_literal_body).unwrap().join().unwrap();
}

fn regex_literal_body() {
    let deep = format!("{}1{}", "(".repeat(3000), ")".repeat(3000));
    for code in [
        format!("function execute(){{ return 1; }}\nvar r = /'/; var x = {deep};"),
        format!("function execute(){{ return 1; }}\nvar r = /\"[/]\\//g; var x = {deep};"),
        format!("function execute(){{ return 1; }}\nif (1) /`/.test(''); var x = {deep};"),
        // `for await (…)` is a loop's head too.
        format!("async function execute(){{ for await (const x of []) /'/; var x = {deep}; return 1; }}"),
        // A line ends a comment at a carriage return too, for the parser as for the scan.
        format!("function execute(){{ return 1; }} // note\rvar x = {deep};"),
        // A `\` before CR LF continues a string past them, for the parser as for the scan.
        format!("function execute(){{ return 1; }}\nvar s = 'a\\\r\nb'; var x = {deep};"),
    ] {
        let (code_, reason) = rejected(&code);
        assert_eq!(code_, "too_deep", "{reason}");
    }
    // Regex literals and divisions side by side still run, quotes and slashes in them included.
    let code = r#"function execute(i) { const q = /'[)(/]"/g; const h = i.n / 2 / 1; if (h) /x/.test("'"); return { q: "a'/\"b".replace(q, '-'), h: [h] / 1, c: `${i.n / 2}` }; }"#;
    assert_ok(&run(&runner(), code, json!({ "n": 4 })), json!({ "q": "a-b", "h": 2, "c": "2" }));
    let code = "async function execute(){ const r = []; for await (const x of [1, 2]) /a/.test('a') && r.push(x); return r; }";
    assert_ok(&run(&runner(), code, json!({})), json!([1, 2]));
}

#[test]
fn a_division_the_scan_could_read_as_a_regex_hides_no_brackets_from_the_nesting_count() {
    std::thread::Builder::new().stack_size(8 << 20).spawn(ambiguous_slash_body).unwrap().join().unwrap();
}

fn ambiguous_slash_body() {
    // Each `/` here divides, but its previous token alone would start a regex: read as one, the
    // brackets up to the next `/` were skipped and the parser ran out of stack.
    let deep = format!("{}1{}", "(".repeat(3000), ")".repeat(3000));
    for code in [
        format!("function execute(){{ return 1; }}\nvar f = function(){{}} / 2 + {deep} / 3;"),
        format!("function execute(){{ return 1; }}\nvar f = async function*(){{}} / 2 + {deep} / 3;"),
        format!("function execute(){{ return 1; }}\nvar f = class {{}} / 2 + {deep} / 3;"),
        format!("function execute(){{ return {{}} / 2 + {deep} / 3; }}"),
        format!("function execute(){{ return 1 ? 1 : {{}} / 2 + {deep} / 3; }}"),
        format!("function execute(){{ return 1 > {{}} / 2 + {deep} / 3; }}"),
        format!("function execute(){{ return 1; }}\nvar of = 1; var x = of / 2 + {deep} / 3;"),
        format!("function execute(){{ return 1; }}\nvar yield = 1; var x = yield / 2 + {deep} / 3;"),
        format!("function execute(){{ return 1; }}\nvar await = 1; var x = await / 2 + {deep} / 3;"),
        // A quote in the text a regex would have been: a string to the division reading.
        format!("function execute(){{ return 1; }}\nvar of = 1; var x = of / 2 + '/' + {deep};"),
        // Other contextual keywords are names before a `/`: a regex never follows them.
        format!("function execute(){{ return 1; }}\nvar let = 1, async = 1; var x = let / 2 + async / 2 + {deep} / 3;"),
    ] {
        let (code_, reason) = rejected(&code);
        assert_eq!(code_, "too_deep", "{}…: {reason}", &code[..70]);
    }
    // Each such `/` costs a second reading of what follows, so their number is bounded.
    let code = format!("function execute(){{ return 1; }}\n{}", "if (1) {}\n/a/.test('');\n".repeat(5000));
    let (code_, reason) = rejected(&code);
    assert!(code_ == "too_deep" && reason.contains("read both ways"), "{reason}");
    // Where a `/` after those tokens starts a regex, the regex's text is still not code.
    let code = format!("function execute(){{ return 1; }}\nfunction f(){{}}\n/'/.test('a'); var x = {deep};");
    assert_eq!(rejected(&code).0, "too_deep");
    // Ordinary code with either reading of each runs.
    let code = r#"
function execute(i) {
  var of = i.n, r = [];
  for (const m of /a(b)/g.exec('xab')) r.push(m);
  function* g() { yield /'[)(]/.source; }
  if (of) { r.push(of / 2) }
  /x/.test('x') && r.push(g().next().value);
  const f = function () { return 4; } / 2, c = class {} / 2;
  const o = { half: of / 2, re: /\//.test('a/') };
  return [r, of / 4, isNaN(f) && isNaN(c), o.half, o.re, (() => { return /y/; })().source];
}"#;
    assert_ok(&run(&runner(), code, json!({ "n": 8 })), json!([["ab", "b", 4, "'[)(]"], 2, true, 4, true, "y"]));
}

#[test]
fn operator_and_keyword_chains_are_rejected_before_parsing() {
    std::thread::Builder::new().stack_size(8 << 20).spawn(chains_body).unwrap().join().unwrap();
}

fn chains_body() {
    let n = 5000;
    for chain in [
        format!("return {}1;", "a+".repeat(n)),
        format!("return {}1;", "void ".repeat(n)),
        format!("return {}1;", "typeof ".repeat(n)),
        format!("return {}1;", "b=".repeat(n)),
        format!("return {}1;", "a**".repeat(n)),
        format!("return {}a;", "new ".repeat(n)),
        format!("return a{};", "()".repeat(n)),
        format!("return a{};", ".b".repeat(n)),
        format!("return ({}1);", "a,".repeat(n)),
        format!("{}return 1;", "l:".repeat(n)),
        format!("{}return 1;", "if(a)".repeat(n)),
        format!("if(a)a;{}", "else if(a)a;".repeat(n)),
        // A statement ended by a line break, not a `;`, does not end a chain that goes on.
        format!("return {}1;", "a+\n".repeat(n)),
        // An object or a function in the chain neither.
        format!("return {}1;", "a+{}+".repeat(n)),
        format!("return {}1;", "a+function(){}+".repeat(n)),
        format!("return {}1;", "a`t`+".repeat(n)),
    ] {
        let code = format!("function execute(){{ let a = 1, b; {chain} }}");
        let (code_, reason) = rejected(&code);
        assert_eq!(code_, "too_deep", "{}…: {reason}", &chain[..40]);
    }
}

#[test]
fn long_flat_code_is_not_taken_for_nesting() {
    std::thread::Builder::new().stack_size(8 << 20).spawn(long_flat_code_body).unwrap().join().unwrap();
}

fn long_flat_code_body() {
    // Statements with or without semicolons, big literals, else-if ladders and switches: long,
    // but flat.
    let lines = (0..600).map(|k| format!("  s = s + {k} * 2 - 1\n  if (s > 1e9) {{ s = 0 }}\n")).collect::<String>();
    let table = (0..600).map(|k| format!("k{k}: [{k}, -{k}, 'v{k}'],")).collect::<String>();
    let ladder = (0..200).map(|k| format!("else if (i.n === {k}) r = {k};\n")).collect::<String>();
    let cases = (0..600).map(|k| format!("case {k}: case -{k}:\n")).collect::<String>();
    let chained = ".map((x) => x + 1)".repeat(100);
    let code = format!(
        "function execute(i) {{\n let s = 0, r = -1\n{lines} const t = {{ {table} }}\n if (i.n < 0) r = 0;\n{ladder} switch (i.n) {{ {cases} r += 1 }}\n return [s, r, t.k599[2], [1]{chained}[0]];\n}}"
    );
    assert_ok(&run(&runner(), &code, json!({ "n": 7 })), json!([358800, 8, "v599", 101]));
}

#[test]
fn a_lookup_written_as_a_conditional_chain_of_comparisons_runs() {
    std::thread::Builder::new().stack_size(8 << 20).spawn(conditional_lookup_body).unwrap().join().unwrap();
}

fn conditional_lookup_body() {
    // `n === 1 ? 'v1' : n === 2 ? …`: each `===` counted 3, as three operators, and 60 branches
    // were refused. A `===` nests no deeper than a `+`.
    let branches = (1..=80).map(|k| format!("n === {k} ? 'v{k}' : ")).collect::<String>();
    let code = format!("function execute(i) {{ const n = i.n; return {branches}'none'; }}");
    assert_ok(&run(&runner(), &code, json!({ "n": 79 })), json!("v79"));
    // Past the limit, such chains are still refused before parsing.
    for code in [
        format!("function execute(n) {{ return {}0; }}", "n === 1 ? 1 : ".repeat(100)),
        format!("function execute(n) {{ return {}n; }}", "n !== ".repeat(300)),
        format!("function execute(n) {{ return {}n; }}", "n && ".repeat(300)),
    ] {
        let (code_, reason) = rejected(&code);
        assert_eq!(code_, "too_deep", "{}…: {reason}", &code[..50]);
    }
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

#[test]
fn names_of_host_globals_the_code_declares_itself_are_its_own() {
    let code = r#"
        function process(item) { return item * 2; }
        function execute(input) {
            const parent = [0, 1, 2];
            const { top, left } = { top: 3, left: 4 };
            let module = 'm';
            const self = [5].map((self) => self)[0];
            try { throw 6; } catch (window) { return parent[2] + top + left + module.length + self + window + process(1); }
        }"#;
    assert_ok(&run(&runner(), code, json!({})), json!(2 + 3 + 4 + 1 + 5 + 6 + 2));
    // Used without being declared, they are still refused with the reason.
    for (code, needle) in [
        ("function execute(){ return parent.x; }", "global object"),
        ("function execute(){ module.exports = 1; return 1; }", "CommonJS"),
        ("function execute(){ const p = 1; return process.env; }", "process"),
    ] {
        let (code_, message) = rejected(code);
        assert!(code_ == "blocked_identifier" && message.contains(needle), "{code} → {code_}: {message}");
    }
}

#[test]
fn blocked_names_the_code_declares_are_absent_from_the_realm_unless_always_refused() {
    // A declared blocked name is let through only because no realm binding of it exists: a use
    // of it that the declaration does not cover fails at runtime (ReferenceError), never reaching
    // a host global. `globalThis` and `Function` exist, so they are refused even when declared.
    for name in [
        "parent",
        "top",
        "self",
        "window",
        "global",
        "frames",
        "module",
        "exports",
        "process",
        "document",
        "location",
        "navigator",
        "setTimeout",
        "queueMicrotask",
        "postMessage",
        "Worker",
        "WebAssembly",
        "Atomics",
        "SharedArrayBuffer",
        "WeakRef",
        "require",
    ] {
        let code = format!("function shadow({name}) {{ return {name}; }}\nfunction execute() {{ return typeof {name}; }}");
        assert_ok(&run(&runner(), &code, json!({})), json!("undefined"));
    }
    for code in ["function execute(){ const globalThis = 1; return globalThis; }", "function execute(){ let Function = 1; return Function; }"] {
        assert_eq!(rejected(code).0, "blocked_identifier", "{code}");
    }
}

#[test]
fn a_local_named_like_an_opt_in_api_is_the_codes_own_and_the_api_still_needs_the_allowlist() {
    let own = "function execute(){ const crypto = { strength: 3 }; const fetch = (x) => x * 2; return fetch(crypto.strength); }";
    assert_ok(&run(&runner(), own, json!({})), json!(6));
    // The declaration covers its own scope only: `fetch` reached elsewhere is not the host's
    // (outside the allowlist the realm offers none that runs), and the execution fails.
    let elsewhere = "function helper(){ const fetch = 1; return fetch; }\nasync function execute(){ return await fetch('https://example.com'); }";
    let r = run(&runner(), elsewhere, json!({}));
    assert_eq!((r.status, r.error.map(|e| e.code)), (SandboxStatus::Error, Some("runtime_error".to_string())), "{:?}", r.output);
}

//! The runner contract: `execute(input)` sync or async, JSON in and out, bounded logs.
#![cfg(feature = "sandbox")]
mod support;
use crucible::sandbox::SandboxStatus;
use serde_json::json;
use support::*;

#[test]
fn sync_execute_returns_json_output() {
    let r = run(&runner(), "function execute(input) { return { n: input.n + 1 }; }", json!({"n": 1}));
    assert_ok(&r, json!({"n": 2}));
    assert!(r.duration_ms >= 0.0);
}

#[test]
fn async_execute_is_awaited() {
    let r = run(&runner(), "async function execute(input) { await null; return { n: input.n * 2 }; }", json!({"n": 21}));
    assert_ok(&r, json!({"n": 42}));
}

#[test]
fn arrow_const_execute_is_found() {
    let r = run(&runner(), "const execute = (i) => i.s.toUpperCase();", json!({"s": "ab"}));
    assert_ok(&r, json!("AB"));
}

#[test]
fn missing_execute_is_an_error() {
    let r = run(&runner(), "function run(i) { return 1; }", json!({}));
    assert_status(&r, SandboxStatus::Error, "no_execute");
}

#[test]
fn thrown_error_becomes_error_with_message() {
    let r = run(&runner(), "function execute() { throw new RangeError('bad input'); }", json!({}));
    assert_status(&r, SandboxStatus::Error, "runtime_error");
    assert_eq!(r.error.unwrap().message, "RangeError: bad input");
}

#[test]
fn rejected_promise_becomes_error() {
    let r = run(&runner(), "async function execute() { throw new Error('nope'); }", json!({}));
    assert_status(&r, SandboxStatus::Error, "runtime_error");
    assert_eq!(r.error.unwrap().message, "Error: nope");
}

#[test]
fn console_is_captured_and_bounded() {
    let r = run(&runner(), "function execute() { console.log('a', 1, {b: 2}); console.warn('w'); console.error('e'); return 0; }", json!({}));
    assert_ok(&r, json!(0));
    assert_eq!(r.logs, vec!["a 1 {\"b\":2}", "warn: w", "error: e"]);
    let r = run(&runner(), "function execute() { for (let i = 0; i < 1000; i++) console.log('x'.repeat(100)); return 1; }", json!({}));
    assert_ok(&r, json!(1));
    assert!(r.logs.len() <= 201, "{}", r.logs.len());
    assert_eq!(r.logs.last().unwrap(), "[console output truncated]");
}

#[test]
fn console_output_is_capped_by_bytes_as_well_as_entries() {
    // Lines of 4000 bytes: 8 fit in the 32 KiB cap; the 9th is replaced by the marker and
    // everything after it is dropped, well before the 200-entry cap.
    let r = run(
        &runner(),
        "function execute() { for (let i = 0; i < 20; i++) console.log(String(i).padStart(4000, '.')); console.log('after'); return 1; }",
        json!({}),
    );
    assert_ok(&r, json!(1));
    assert_eq!(r.logs.len(), 9, "{:?}", r.logs.iter().map(String::len).collect::<Vec<_>>());
    for (i, line) in r.logs[..8].iter().enumerate() {
        assert_eq!(line.len(), 4000);
        assert!(line.ends_with(&format!(".{i}")), "line {i} out of order");
    }
    assert_eq!(r.logs[8], "[console output truncated]");
    // One line larger than the cap is dropped whole, not kept in part, and later lines too.
    let r = run(&runner(), "function execute() { console.log('small'); console.log('y'.repeat(40000)); console.log('later'); return 1; }", json!({}));
    assert_ok(&r, json!(1));
    assert_eq!(r.logs, vec!["small", "[console output truncated]"]);
}

#[test]
fn benchmark_tools_produce_expected_output() {
    let runner = runner();
    let slug = "function execute(input){const s=input.text.toLowerCase().replace(/[^a-z0-9]+/g,'-').replace(/^-|-$/g,'');return {slug:s};}";
    assert_ok(&run(&runner, slug, json!({"text": "Hello, World!"})), json!({"slug": "hello-world"}));
    let csv = "function execute(input){const d=input.delimiter||',';const l=input.csv.trim().split('\\n');const h=l[0].split(d).map(x=>x.trim());return {headers:h,rows:l.slice(1).map(r=>{const v=r.split(d);return Object.fromEntries(h.map((k,i)=>[k,v[i]?.trim()]))})};}";
    assert_ok(&run(&runner, csv, json!({"csv": "a,b\n1,2"})), json!({"headers": ["a","b"], "rows": [{"a":"1","b":"2"}]}));
    let temp = "function execute(input){const {value,from,to}=input;let c=from==='C'?value:from==='F'?(value-32)*5/9:value-273.15;let r=to==='C'?c:to==='F'?c*9/5+32:c+273.15;return {result:Math.round(r*100)/100};}";
    assert_ok(&run(&runner, temp, json!({"value": 100, "from": "C", "to": "F"})), json!({"result": 212}));
}

#[test]
fn error_subclass_can_set_name_on_frozen_intrinsics() {
    let r = run(&runner(), "class MyErr extends Error { constructor(m){ super(m); this.name = 'MyErr'; } } function execute(){ const e = new MyErr('x'); const o = {}; o.toString = () => 'y'; return [e.name, e.message, String(o), e instanceof Error]; }", json!({}));
    assert_ok(&r, json!(["MyErr", "x", "y", true]));
}

#[test]
fn crypto_digests_and_hmac_match_known_vectors() {
    let r = run_with(&runner(), "function execute(){ return [crypto.sha256('abc'), crypto.digest('SHA-512', ''), crypto.hmac('SHA-256', 'key', 'The quick brown fox jumps over the lazy dog'), /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/.test(crypto.randomUUID())]; }", json!({}), &["crypto"]);
    assert_ok(
        &r,
        json!([
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
            "cf83e1357eefb8bdf1542850d66d8007d620e4050b5715dc83f4a921d36ce9ce47d0d13c5d85f2b0ff8318d2877eec2f63b931bd47417a81a538327af927da3e",
            "f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8",
            true
        ]),
    );
}

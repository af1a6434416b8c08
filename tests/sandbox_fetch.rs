//! The fetch bridge: plain request out, plain response in, through a host test double.
#![cfg(feature = "sandbox")]
mod support;
use std::{cell::RefCell, rc::Rc};

use crucible::sandbox::boa::{BoaRunner, FetchFuture, FetchHost, FetchRequest, FetchResponse, SandboxLimits};
use crucible::sandbox::{SandboxRequest, SandboxRunner, SandboxStatus};
use serde_json::json;

/// Answers every request with a fixed JSON body and records what it was asked.
#[derive(Default)]
struct ScriptedFetch {
    seen: RefCell<Vec<FetchRequest>>,
}

impl FetchHost for ScriptedFetch {
    fn fetch(&self, request: FetchRequest) -> FetchFuture {
        self.seen.borrow_mut().push(request.clone());
        Box::pin(async move {
            if request.url.contains("deny") {
                return Err("host refused: \u{7}not allowlisted".into());
            }
            Ok(FetchResponse {
                status: 200,
                status_text: "OK".into(),
                url: request.url,
                headers: vec![("Content-Type".into(), "application/json".into())],
                body: r#"{"answer":42}"#.into(),
            })
        })
    }
}

fn exec(runner: &BoaRunner, code: &str) -> crucible::sandbox::SandboxResult {
    futures::executor::block_on(runner.execute(&SandboxRequest { code: code.into(), input: json!({}), allowlist: vec!["fetch".into()] }))
}

#[test]
fn fetch_sends_a_plain_request_and_returns_a_plain_response() {
    let host = Rc::new(ScriptedFetch::default());
    let runner = BoaRunner::with_fetch_host(SandboxLimits::default(), host.clone());
    let r = exec(&runner, "async function execute(){ const r = await fetch('https://api.example.com/x', { method: 'post', headers: { 'X-A': 'b' }, body: JSON.stringify({q: 1}) }); const j = await r.json(); return { status: r.status, ok: r.ok, ct: r.headers.get('content-type'), j, text: await r.text(), frozen: Object.isFrozen(r) }; }");
    assert_eq!(r.status, SandboxStatus::Ok, "{r:?}");
    assert_eq!(r.output.unwrap(), json!({"status": 200, "ok": true, "ct": "application/json", "j": {"answer": 42}, "text": "{\"answer\":42}", "frozen": true}));
    let seen = host.seen.borrow();
    assert_eq!(
        seen[0],
        FetchRequest {
            url: "https://api.example.com/x".into(),
            method: "POST".into(),
            headers: vec![("X-A".into(), "b".into())],
            body: Some("{\"q\":1}".into())
        }
    );
}

#[test]
fn host_refusals_become_sanitised_guest_type_errors() {
    let runner = BoaRunner::with_fetch_host(SandboxLimits::default(), Rc::new(ScriptedFetch::default()));
    let r = exec(&runner, "async function execute(){ try { await fetch('https://deny.example'); } catch (e) { return [e instanceof TypeError, e.message]; } }");
    assert_eq!(r.output.unwrap(), json!([true, "fetch failed: host refused: not allowlisted"]));
}

#[test]
fn fetch_calls_per_execution_are_capped() {
    let runner = BoaRunner::with_fetch_host(SandboxLimits { max_fetches: 2, ..SandboxLimits::default() }, Rc::new(ScriptedFetch::default()));
    let r = exec(&runner, "async function execute(){ await fetch('https://a.example'); await fetch('https://a.example'); try { await fetch('https://a.example'); } catch (e) { return e.message; } }");
    assert!(r.output.unwrap().as_str().unwrap().contains("at most 2"));
}

#[test]
fn an_oversized_url_never_reaches_the_host() {
    let host = Rc::new(ScriptedFetch::default());
    let runner = BoaRunner::with_fetch_host(SandboxLimits::default(), host.clone());
    let r = exec(
        &runner,
        "async function execute(){ try { await fetch('https://a.example/?' + 'a'.repeat(3e6)); } catch (e) { return [e instanceof TypeError, e.message]; } }",
    );
    let out = r.output.unwrap();
    assert_eq!(out[0], true);
    assert!(out[1].as_str().unwrap().contains("the limit is 16384"), "{out}");
    assert!(host.seen.borrow().is_empty());
    // A URL of ordinary length goes out.
    assert_eq!(exec(&runner, "async function execute(){ return (await fetch('https://a.example/?' + 'a'.repeat(8000))).status; }").output.unwrap(), json!(200));
}

#[test]
fn a_request_over_the_size_cap_never_reaches_the_host() {
    let host = Rc::new(ScriptedFetch::default());
    let runner = BoaRunner::with_fetch_host(SandboxLimits::default(), host.clone());
    // A body past 1 MiB, and a body and header that pass it only together: the cap is on the
    // whole request, checked in the sandbox before anything crosses to the host.
    for init in ["{ method: 'POST', body: 'a'.repeat(1048577) }", "{ method: 'POST', headers: { 'X-Big': 'h'.repeat(600000) }, body: 'b'.repeat(600000) }"] {
        let code = format!("async function execute(){{ try {{ await fetch('https://a.example/up', {init}); return 'sent'; }} catch (e) {{ return [e instanceof TypeError, e.message]; }} }}");
        let r = exec(&runner, &code);
        assert_eq!(r.status, SandboxStatus::Ok, "{r:?}");
        let out = r.output.unwrap();
        assert_eq!(out[0], true, "{out}");
        assert!(out[1].as_str().unwrap().contains("larger than 1048576 bytes"), "{out}");
    }
    assert!(host.seen.borrow().is_empty(), "an oversized request reached the host");
    // A body under the cap goes out whole.
    let r = exec(&runner, "async function execute(){ return (await fetch('https://a.example/up', { method: 'POST', body: 'a'.repeat(1000000) })).status; }");
    assert_eq!(r.output, Some(json!(200)), "{r:?}");
    assert_eq!(host.seen.borrow()[0].body.as_ref().map(String::len), Some(1_000_000));
}

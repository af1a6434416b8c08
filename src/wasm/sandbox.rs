//! Exports of the `crucible_sandbox` artifact, loaded by the sandbox Worker (never by the core).
//!
//! ```ts
//! init(limitsJson: string, fetch: (requestJson: string) => Promise<string>): void
//! execute(requestJson: string): Promise<string>   // SandboxResult JSON, never rejects
//! allocationFailed(): boolean                      // after a trap: was it out of memory?
//! ```
//! Only JSON strings cross the boundary. The instance imports a capped `WebAssembly.Memory`
//! (see `build.rs`); a failed allocation aborts (a trap) and the Worker discards the instance.

use std::{
    alloc::{GlobalAlloc, Layout},
    cell::RefCell,
    rc::Rc,
    sync::atomic::{AtomicBool, Ordering},
};

use serde::Deserialize;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

use crate::sandbox::{
    boa::{BoaRunner, FetchFuture, FetchHost, FetchRequest, FetchResponse, SandboxLimits},
    SandboxFailure, SandboxRequest, SandboxResult, SandboxRunner, SandboxStatus,
};

/// The Worker's allocator ([`INNER`]), flagging the first failed allocation so the Worker can report a
/// trap as `memory` rather than `error`. A size too large to even ask for (`'x'.repeat(2**29)`
/// reserves 2^29 slices up front) panics with "capacity overflow" instead: the panic hook set at
/// `init` flags that too.
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
struct FlaggingAllocator;

static ALLOCATION_FAILED: AtomicBool = AtomicBool::new(false);

/// What [`FlaggingAllocator`] allocates with: Talc in the Worker, about 2.5 KB smaller gzipped
/// than dlmalloc, the wasm default, and as fast here; like it, it returns null when
/// `memory.grow` fails at the cap (the sandbox's memory tests hold).
#[cfg(target_arch = "wasm32")]
static INNER: talc::wasm::WasmDynamicTalc = talc::wasm::new_wasm_dynamic_allocator();
#[cfg(not(target_arch = "wasm32"))]
static INNER: std::alloc::System = std::alloc::System;

unsafe impl GlobalAlloc for FlaggingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { INNER.alloc(layout) };
        if p.is_null() {
            ALLOCATION_FAILED.store(true, Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { INNER.alloc_zeroed(layout) };
        if p.is_null() {
            ALLOCATION_FAILED.store(true, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { INNER.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { INNER.realloc(ptr, layout, new_size) };
        if p.is_null() {
            ALLOCATION_FAILED.store(true, Ordering::Relaxed);
        }
        p
    }
}

#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOCATOR: FlaggingAllocator = FlaggingAllocator;

thread_local! {
    static RUNNER: RefCell<Option<Rc<BoaRunner>>> = const { RefCell::new(None) };
}

/// Limits as the TS host sends them (camelCase, all optional).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct InitLimits {
    timeout_ms: Option<u64>,
    memory_mb: Option<u64>,
    max_jobs: Option<u64>,
    loop_iteration_limit: Option<u64>,
    max_output_bytes: Option<usize>,
    max_fetch_body_bytes: Option<usize>,
}

/// Bridges `fetch` to the JS callback given at `init`: JSON string out, JSON string back.
struct JsFetchHost {
    callback: js_sys::Function,
}

impl FetchHost for JsFetchHost {
    fn fetch(&self, request: FetchRequest) -> FetchFuture {
        let json = serde_json::to_string(&request).unwrap_or_default();
        // The host's promise gets its handlers now, not when (or if) this future is first
        // polled: guest code may never await its fetch, and a refusal nobody handles would be
        // an unhandled rejection in the Worker, which the Worker treats as a trap.
        let pending = match self.callback.call1(&JsValue::NULL, &JsValue::from_str(&json)) {
            Ok(v) => v.dyn_into::<js_sys::Promise>().map(JsFuture::from).map_err(|_| "fetch host did not return a promise".to_string()),
            Err(e) => Err(js_message(&e)),
        };
        Box::pin(async move {
            let value = pending?.await.map_err(|e| js_message(&e))?;
            let text = value.as_string().ok_or_else(|| "fetch host returned a non-string".to_string())?;
            serde_json::from_str::<FetchResponse>(&text).map_err(|e| format!("bad fetch host response: {e}"))
        })
    }
}

/// A host rejection's message as plain text (the host object itself never reaches the guest).
fn js_message(value: &JsValue) -> String {
    if let Some(s) = value.as_string() {
        return s;
    }
    js_sys::Reflect::get(value, &JsValue::from_str("message")).ok().and_then(|m| m.as_string()).unwrap_or_else(|| "fetch failed".into())
}

/// Creates the runner and builds its frozen realm (so the first call is warm).
#[wasm_bindgen]
pub fn init(limits_json: &str, fetch: js_sys::Function) -> Result<(), JsValue> {
    let l: InitLimits = serde_json::from_str(limits_json).map_err(|e| JsValue::from_str(&e.to_string()))?;
    let d = SandboxLimits::default();
    let limits = SandboxLimits {
        timeout_ms: l.timeout_ms.unwrap_or(d.timeout_ms),
        memory_bytes: l.memory_mb.map_or(d.memory_bytes, |mb| mb << 20),
        max_jobs: l.max_jobs.unwrap_or(d.max_jobs),
        loop_iteration_limit: l.loop_iteration_limit.unwrap_or(d.loop_iteration_limit),
        max_output_bytes: l.max_output_bytes.unwrap_or(d.max_output_bytes),
        max_fetch_body_bytes: l.max_fetch_body_bytes.unwrap_or(d.max_fetch_body_bytes),
        ..d
    };
    // A panic aborts the instance (a trap) after the hook has run.
    std::panic::set_hook(Box::new(|info| {
        // `PanicHookInfo::payload_as_str` would do, past the crate's MSRV.
        let payload = info.payload();
        let message = payload.downcast_ref::<&str>().copied().or_else(|| payload.downcast_ref::<String>().map(String::as_str));
        // (A failed allocation aborts without a panic; the allocator flags that one itself.)
        if message.is_some_and(|m| m.contains("capacity overflow")) {
            ALLOCATION_FAILED.store(true, Ordering::Relaxed);
        }
    }));
    let runner = Rc::new(BoaRunner::with_fetch_host(limits, Rc::new(JsFetchHost { callback: fetch })));
    runner.warm().map_err(|e| JsValue::from_str(&e))?;
    RUNNER.with(|r| *r.borrow_mut() = Some(runner));
    Ok(())
}

/// Runs one request (SandboxRequest JSON) and resolves to SandboxResult JSON. Never rejects.
#[wasm_bindgen]
pub async fn execute(request_json: String) -> String {
    // An allocation that failed in an earlier execution and was handled (Boa reserves some
    // buffers fallibly) says nothing about a trap in this one.
    ALLOCATION_FAILED.store(false, Ordering::Relaxed);
    // `JSON.stringify` escapes a lone surrogate in the input (text cut inside an emoji) as
    // `\udXXX`: read as U+FFFD, as the core reads every other string from JS.
    let result = match serde_json::from_str::<SandboxRequest>(&crate::js_json::well_formed(&request_json)) {
        Err(e) => failure("bad_request", format!("request is not valid JSON: {e}")),
        Ok(request) => match RUNNER.with(|r| r.borrow().clone()) {
            None => failure("not_initialized", "init() was not called".into()),
            Some(runner) => runner.execute(&request).await,
        },
    };
    serde_json::to_string(&result)
        .unwrap_or_else(|_| r#"{"status":"error","error":{"code":"internal","message":"result serialisation failed"},"logs":[],"durationMs":0}"#.into())
}

/// Whether an allocation has failed, or a size overflowed, in this execution (read by the
/// Worker after a trap).
#[wasm_bindgen(js_name = allocationFailed)]
pub fn allocation_failed() -> bool {
    ALLOCATION_FAILED.load(Ordering::Relaxed)
}

fn failure(code: &str, message: String) -> SandboxResult {
    SandboxResult { status: SandboxStatus::Error, output: None, error: Some(SandboxFailure { code: code.into(), message }), logs: vec![], duration_ms: 0.0 }
}

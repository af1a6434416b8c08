//! Host APIs visible to guest code: bounded `console`, opt-in `crypto` (SHA-256/512 digests,
//! HMAC, `randomUUID`, all in Rust) and opt-in `fetch`, bridged through [`FetchHost`]: a plain
//! request description goes out, a plain response description comes back. No host object ever
//! reaches the guest; host failures become fresh guest `TypeError`s with sanitised messages.
//!
//! Native functions read their arguments without running guest code: strings must be primitive
//! strings (no `toString`/`valueOf` coercion) and option objects go through the converter (own
//! data properties only), so getters in arguments cannot re-enter a host API.

use std::{cell::RefCell, future::Future, pin::Pin, rc::Rc};

use boa_engine::{
    job::NativeAsyncJob,
    js_string,
    object::{builtins::JsPromise, JsObject, ObjectInitializer},
    property::Attribute,
    Context, JsArgs, JsNativeError, JsResult, JsString, JsValue, NativeFunction,
};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256, Sha512};

use super::convert::{to_json, Caps};

/// A plain HTTP request description sent to the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FetchRequest {
    pub url: String,
    pub method: String,
    pub headers: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

/// A plain HTTP response description returned by the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FetchResponse {
    pub status: u16,
    #[serde(default)]
    pub status_text: String,
    #[serde(default)]
    pub url: String,
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    #[serde(default)]
    pub body: String,
}

/// A future resolving to the host's answer; `Err` carries a message the guest may see.
pub type FetchFuture = Pin<Box<dyn Future<Output = Result<FetchResponse, String>>>>;

/// The host side of the `fetch` bridge (the Worker host in wasm, a test double natively).
/// The host applies the domain allowlist; the sandbox never performs I/O itself.
pub trait FetchHost {
    fn fetch(&self, request: FetchRequest) -> FetchFuture;
}

/// A [`FetchHost`] that refuses every request.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoFetch;

impl FetchHost for NoFetch {
    fn fetch(&self, _request: FetchRequest) -> FetchFuture {
        Box::pin(async { Err("fetch is not configured on this host".to_string()) })
    }
}

/// Per-execution state the native functions read through the context.
#[derive(Debug, Default)]
pub(crate) struct ExecState {
    pub logs: Vec<String>,
    pub log_bytes: usize,
    pub logs_truncated: bool,
    pub allow_fetch: bool,
    pub allow_crypto: bool,
    pub fetches: u32,
}

/// Limits the host APIs enforce.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostLimits {
    pub max_log_entries: usize,
    pub max_log_bytes: usize,
    pub max_fetches: u32,
    pub max_fetch_body_bytes: usize,
    pub max_fetch_request_bytes: usize,
}

/// Shared between the realm and its native functions (stored as context data).
pub(crate) struct HostState {
    pub exec: RefCell<ExecState>,
    pub limits: HostLimits,
    pub fetch_host: Rc<dyn FetchHost>,
    /// Guest-realm helper building a frozen response object (set once at realm build).
    pub make_response: RefCell<Option<JsObject>>,
}

fn state(context: &Context) -> JsResult<Rc<HostState>> {
    context.get_data::<Rc<HostState>>().cloned().ok_or_else(|| JsNativeError::typ().with_message("host state missing").into())
}

/// Strips control characters and bounds length: host messages shown to the guest.
pub(crate) fn sanitize(message: &str, max: usize) -> String {
    let mut out: String = message.chars().filter(|c| !c.is_control()).take(max).collect();
    if message.chars().count() > max {
        out.push('…');
    }
    out
}

fn type_error(message: impl Into<String>) -> boa_engine::JsError {
    JsNativeError::typ().with_message(message.into()).into()
}

fn primitive_string(value: &JsValue, what: &str) -> JsResult<String> {
    match value.as_string() {
        Some(s) => Ok(s.to_std_string_lossy()),
        None => Err(type_error(format!("{what} must be a string"))),
    }
}

// ---- console ----

fn describe_for_log(value: &JsValue, context: &mut Context) -> String {
    if let Some(s) = value.as_string() {
        return s.to_std_string_lossy();
    }
    if value.is_undefined() {
        return "undefined".into();
    }
    let caps = Caps { max_depth: 16, max_nodes: 1_000, max_bytes: 4_096 };
    match to_json(value, caps, context) {
        Ok(v) => v.to_string(),
        Err(_) if value.is_object() => "[object]".into(),
        Err(_) => value.type_of().to_string(),
    }
}

fn console_write(level: &str, args: &[JsValue], context: &mut Context) -> JsResult<JsValue> {
    let st = state(context)?;
    {
        let exec = st.exec.borrow();
        if exec.logs_truncated {
            return Ok(JsValue::undefined());
        }
    }
    let mut line = String::new();
    if level != "log" {
        line.push_str(level);
        line.push_str(": ");
    }
    for (i, arg) in args.iter().enumerate().take(32) {
        if i > 0 {
            line.push(' ');
        }
        line.push_str(&describe_for_log(arg, context));
        if line.len() > st.limits.max_log_bytes {
            break;
        }
    }
    let mut exec = st.exec.borrow_mut();
    if exec.logs.len() >= st.limits.max_log_entries || exec.log_bytes + line.len() > st.limits.max_log_bytes {
        exec.logs_truncated = true;
        exec.logs.push("[console output truncated]".into());
        return Ok(JsValue::undefined());
    }
    exec.log_bytes += line.len();
    exec.logs.push(line);
    Ok(JsValue::undefined())
}

fn console_log(_: &JsValue, args: &[JsValue], c: &mut Context) -> JsResult<JsValue> {
    console_write("log", args, c)
}
fn console_info(_: &JsValue, args: &[JsValue], c: &mut Context) -> JsResult<JsValue> {
    console_write("info", args, c)
}
fn console_warn(_: &JsValue, args: &[JsValue], c: &mut Context) -> JsResult<JsValue> {
    console_write("warn", args, c)
}
fn console_error(_: &JsValue, args: &[JsValue], c: &mut Context) -> JsResult<JsValue> {
    console_write("error", args, c)
}

pub(crate) fn make_console(context: &mut Context) -> JsObject {
    ObjectInitializer::new(context)
        .function(NativeFunction::from_fn_ptr(console_log), js_string!("log"), 0)
        .function(NativeFunction::from_fn_ptr(console_info), js_string!("info"), 0)
        .function(NativeFunction::from_fn_ptr(console_log), js_string!("debug"), 0)
        .function(NativeFunction::from_fn_ptr(console_warn), js_string!("warn"), 0)
        .function(NativeFunction::from_fn_ptr(console_error), js_string!("error"), 0)
        .build()
}

// ---- crypto ----

fn require_crypto(context: &Context) -> JsResult<()> {
    if state(context)?.exec.borrow().allow_crypto {
        Ok(())
    } else {
        Err(type_error("crypto is not in this execution's allowlist"))
    }
}

fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(HEX[(b >> 4) as usize] as char);
        out.push(HEX[(b & 15) as usize] as char);
    }
    out
}

fn algorithm(value: &JsValue) -> JsResult<&'static str> {
    let name = primitive_string(value, "algorithm")?;
    match name.to_ascii_uppercase().replace('_', "-").as_str() {
        "SHA-256" | "SHA256" => Ok("SHA-256"),
        "SHA-512" | "SHA512" => Ok("SHA-512"),
        _ => Err(type_error(format!("unsupported algorithm '{}' (SHA-256 or SHA-512)", sanitize(&name, 40)))),
    }
}

fn digest_hex(alg: &str, data: &[u8]) -> String {
    if alg == "SHA-256" {
        hex(&Sha256::digest(data))
    } else {
        hex(&Sha512::digest(data))
    }
}

/// `crypto.digest(algorithm, text)` → lowercase hex of the UTF-8 bytes' digest.
fn crypto_digest(_: &JsValue, args: &[JsValue], c: &mut Context) -> JsResult<JsValue> {
    require_crypto(c)?;
    let alg = algorithm(args.get_or_undefined(0))?;
    let data = primitive_string(args.get_or_undefined(1), "data")?;
    Ok(JsString::from(digest_hex(alg, data.as_bytes())).into())
}

fn crypto_sha256(_: &JsValue, args: &[JsValue], c: &mut Context) -> JsResult<JsValue> {
    require_crypto(c)?;
    let data = primitive_string(args.get_or_undefined(0), "data")?;
    Ok(JsString::from(digest_hex("SHA-256", data.as_bytes())).into())
}

fn crypto_sha512(_: &JsValue, args: &[JsValue], c: &mut Context) -> JsResult<JsValue> {
    require_crypto(c)?;
    let data = primitive_string(args.get_or_undefined(0), "data")?;
    Ok(JsString::from(digest_hex("SHA-512", data.as_bytes())).into())
}

/// `crypto.hmac(algorithm, key, text)` → lowercase hex HMAC.
fn crypto_hmac(_: &JsValue, args: &[JsValue], c: &mut Context) -> JsResult<JsValue> {
    require_crypto(c)?;
    let alg = algorithm(args.get_or_undefined(0))?;
    let key = primitive_string(args.get_or_undefined(1), "key")?;
    let data = primitive_string(args.get_or_undefined(2), "data")?;
    let out = if alg == "SHA-256" {
        let mut mac = Hmac::<Sha256>::new_from_slice(key.as_bytes()).map_err(|_| type_error("bad key"))?;
        mac.update(data.as_bytes());
        hex(&mac.finalize().into_bytes())
    } else {
        let mut mac = Hmac::<Sha512>::new_from_slice(key.as_bytes()).map_err(|_| type_error("bad key"))?;
        mac.update(data.as_bytes());
        hex(&mac.finalize().into_bytes())
    };
    Ok(JsString::from(out).into())
}

fn crypto_random_uuid(_: &JsValue, _: &[JsValue], c: &mut Context) -> JsResult<JsValue> {
    require_crypto(c)?;
    let mut b = [0u8; 16];
    getrandom_03::fill(&mut b).map_err(|_| type_error("no randomness source"))?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex(&b);
    let uuid = format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32]);
    Ok(JsString::from(uuid).into())
}

pub(crate) fn make_crypto(context: &mut Context) -> JsObject {
    ObjectInitializer::new(context)
        .function(NativeFunction::from_fn_ptr(crypto_digest), js_string!("digest"), 2)
        .function(NativeFunction::from_fn_ptr(crypto_sha256), js_string!("sha256"), 1)
        .function(NativeFunction::from_fn_ptr(crypto_sha512), js_string!("sha512"), 1)
        .function(NativeFunction::from_fn_ptr(crypto_hmac), js_string!("hmac"), 3)
        .function(NativeFunction::from_fn_ptr(crypto_random_uuid), js_string!("randomUUID"), 0)
        .build()
}

// ---- fetch ----

/// Longest URL a guest may fetch (servers commonly refuse past 8 KiB).
pub const MAX_FETCH_URL_BYTES: usize = 16 * 1024;

fn fetch_request(args: &[JsValue], st: &HostState, context: &mut Context) -> JsResult<FetchRequest> {
    let url = primitive_string(args.get_or_undefined(0), "fetch(url): url")?;
    // The URL crosses to the host's main thread, which no sandbox deadline or memory cap covers.
    if url.len() > MAX_FETCH_URL_BYTES {
        return Err(type_error(format!("fetch: the url is {} bytes; the limit is {MAX_FETCH_URL_BYTES}", url.len())));
    }
    let mut request = FetchRequest { url, method: "GET".into(), headers: Vec::new(), body: None };
    let init = args.get_or_undefined(1);
    if init.is_undefined() || init.is_null() {
        return Ok(request);
    }
    let caps = Caps { max_depth: 4, max_nodes: 256, max_bytes: st.limits.max_fetch_request_bytes };
    let init = to_json(init, caps, context).map_err(|e| type_error(format!("fetch(url, init): {e}")))?;
    let Value::Object(init) = init else {
        return Err(type_error("fetch(url, init): init must be a plain object"));
    };
    if let Some(m) = init.get("method") {
        let m = m.as_str().ok_or_else(|| type_error("fetch: method must be a string"))?;
        request.method = m.to_ascii_uppercase();
    }
    if let Some(h) = init.get("headers") {
        let Value::Object(h) = h else { return Err(type_error("fetch: headers must be a plain object of strings")) };
        for (k, v) in h {
            let v = v.as_str().ok_or_else(|| type_error("fetch: header values must be strings"))?;
            request.headers.push((k.clone(), v.to_string()));
        }
    }
    if let Some(b) = init.get("body") {
        if !b.is_null() {
            let b = b.as_str().ok_or_else(|| type_error("fetch: body must be a string (use JSON.stringify)"))?;
            request.body = Some(b.to_string());
        }
    }
    Ok(request)
}

fn build_response(resp: FetchResponse, st: &HostState, context: &mut Context) -> JsResult<JsValue> {
    if resp.body.len() > st.limits.max_fetch_body_bytes {
        return Err(type_error(format!("fetch: response body exceeds {} bytes", st.limits.max_fetch_body_bytes)));
    }
    let headers = JsObject::with_null_proto();
    for (k, v) in &resp.headers {
        headers.create_data_property_or_throw(JsString::from(k.to_ascii_lowercase().as_str()), JsString::from(v.as_str()), context)?;
    }
    let make = st.make_response.borrow().clone().ok_or_else(|| type_error("fetch unavailable"))?;
    make.call(
        &JsValue::undefined(),
        &[
            JsValue::from(f64::from(resp.status)),
            JsString::from(resp.status_text.as_str()).into(),
            JsString::from(resp.url.as_str()).into(),
            headers.into(),
            JsString::from(resp.body.as_str()).into(),
        ],
        context,
    )
}

fn fetch(_: &JsValue, args: &[JsValue], context: &mut Context) -> JsResult<JsValue> {
    let st = state(context)?;
    {
        let mut exec = st.exec.borrow_mut();
        if !exec.allow_fetch {
            return Err(type_error("fetch is not in this execution's allowlist"));
        }
        if exec.fetches >= st.limits.max_fetches {
            return Err(type_error(format!("fetch: at most {} requests per execution", st.limits.max_fetches)));
        }
        exec.fetches += 1;
    }
    let request = fetch_request(args, &st, context)?;
    let future = st.fetch_host.fetch(request);
    let (promise, resolvers) = JsPromise::new_pending(context);
    let st2 = st.clone();
    context.enqueue_job(
        NativeAsyncJob::new(async move |cell: &RefCell<&mut Context>| {
            let outcome = future.await;
            let context = &mut cell.borrow_mut();
            let settled = match outcome {
                Ok(resp) => build_response(resp, &st2, context),
                Err(message) => Err(type_error(format!("fetch failed: {}", sanitize(&message, 300)))),
            };
            match settled {
                Ok(value) => resolvers.resolve.call(&JsValue::undefined(), &[value], context),
                Err(error) => {
                    // A fresh guest error: never a host object.
                    let message = error.as_native().map(|n| n.message().to_string()).unwrap_or_else(|| "fetch failed".into());
                    let fresh = JsNativeError::typ().with_message(sanitize(&message, 300)).into_opaque(context);
                    resolvers.reject.call(&JsValue::undefined(), &[fresh.into()], context)
                }
            }
        })
        .into(),
    );
    Ok(promise.into())
}

pub(crate) fn make_fetch(context: &mut Context) -> JsObject {
    let f = boa_engine::object::FunctionObjectBuilder::new(context.realm(), NativeFunction::from_fn_ptr(fetch)).name(js_string!("fetch")).length(1).build();
    let _ = Attribute::all();
    f.into()
}

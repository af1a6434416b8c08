//! The hardened realm, built once per runner and reused across executions.
//!
//! Reuse is made indistinguishable from a fresh context SES-style:
//! - string compilation is denied by [`SandboxHooks`] (`eval`, `Function`, and
//!   `(()=>{}).constructor(…)` all reach `HostEnsureCanCompileStrings`);
//! - globals outside the allowlist are deleted (`SharedArrayBuffer`, `Atomics`, `WeakRef`,
//!   `FinalizationRegistry`, `eval`);
//! - then every object reachable from the global object and from the hidden intrinsics
//!   (generator/async function prototypes, iterator prototypes, `%TypedArray%`,
//!   `%ThrowTypeError%`, iterator helpers) is deep-frozen, including the global object itself;
//! - user code is compiled as the body of a strict function (see `runner.rs`), so its
//!   declarations are locals that die with the call, and it cannot declare globals;
//! - the job queues are cleared between executions.
//!
//! To keep ordinary code working on frozen intrinsics (the "override mistake": assigning
//! `this.name = …` in an Error subclass would throw), a few prototype properties are turned
//! into accessors whose setter defines an own property on the receiver instead.

use std::rc::Rc;

use boa_engine::{
    context::{ContextBuilder, HostHooks},
    js_string,
    realm::Realm,
    vm::RuntimeLimits,
    Context, JsNativeError, JsObject, JsResult, JsString, JsValue, Source,
};

use super::{
    host_api::{make_console, make_crypto, make_fetch, HostState},
    jobs::GuardedExecutor,
};

/// Host hooks of the sandbox realm.
#[derive(Debug)]
pub(crate) struct SandboxHooks {
    pub max_buffer_size: u64,
}

impl HostHooks for SandboxHooks {
    fn ensure_can_compile_strings(&self, _realm: Realm, _parameters: &[JsString], _body: &JsString, _direct: bool, _context: &mut Context) -> JsResult<()> {
        Err(JsNativeError::eval().with_message("string compilation (eval, Function) is disabled in the sandbox").into())
    }

    fn max_buffer_size(&self, _context: &mut Context) -> u64 {
        self.max_buffer_size
    }
}

/// Globals removed before freezing.
const REMOVED_GLOBALS: &[&str] = &["SharedArrayBuffer", "Atomics", "WeakRef", "FinalizationRegistry", "eval", "escape", "unescape"];

/// Tames the override mistake, then deep-freezes everything reachable. Returns the guest-realm
/// helpers the host needs (kept by Rust, never exposed on the global object).
const BOOTSTRAP: &str = r#"(function (hostObjects) {
  'use strict';
  const { getOwnPropertyDescriptor, defineProperty, freeze, getPrototypeOf } = Object;
  const ownKeys = Reflect.ownKeys;
  const TypeErrorCtor = TypeError;
  // A tamed value is then held only by its accessor's closure, where the walk below (which
  // follows properties and prototypes) would never reach it: it is frozen as a root, or guest
  // code could change `Object.prototype.hasOwnProperty`'s prototype and see the next tool's
  // calls through it.
  const tamed = [];
  const tame = (obj, key) => {
    const desc = getOwnPropertyDescriptor(obj, key);
    if (!desc || !('value' in desc)) return;
    const value = desc.value;
    tamed.push(value);
    defineProperty(obj, key, {
      get() { return value; },
      set(v) {
        if (this === obj) throw new TypeErrorCtor('Cannot assign to a frozen intrinsic property');
        defineProperty(this, key, { value: v, writable: true, enumerable: true, configurable: true });
      },
      enumerable: desc.enumerable,
      configurable: false,
    });
  };
  for (const key of ['constructor', 'toString', 'valueOf', 'toLocaleString', 'hasOwnProperty']) tame(Object.prototype, key);
  const errors = [Error, TypeError, RangeError, SyntaxError, ReferenceError, EvalError, URIError];
  if (typeof AggregateError === 'function') errors.push(AggregateError);
  for (const E of errors) for (const key of ['name', 'message', 'constructor', 'toString']) tame(E.prototype, key);
  tame(Function.prototype, 'toString');

  const roots = [globalThis, ...hostObjects, ...tamed];
  roots.push(getPrototypeOf(function* () {}), getPrototypeOf(async function () {}), getPrototypeOf(async function* () {}));
  roots.push((function* () {})(), (async function* () {})());
  roots.push([][Symbol.iterator](), new Map()[Symbol.iterator](), new Set()[Symbol.iterator](), ''[Symbol.iterator]());
  roots.push('a'.matchAll(/a/g), getPrototypeOf(Uint8Array));
  roots.push(getOwnPropertyDescriptor((function () { return arguments; })(), 'callee'));
  if (typeof Iterator === 'function') {
    roots.push([].values().map((x) => x));
    if (typeof Iterator.from === 'function') roots.push(Iterator.from({ next() { return { done: true }; } }));
  }

  const makeResponse = function (status, statusText, url, headers, body) {
    const get = function (name) { const v = headers[String(name).toLowerCase()]; return v === undefined ? null : v; };
    const has = function (name) { return headers[String(name).toLowerCase()] !== undefined; };
    return freeze({
      status, statusText, url, ok: status >= 200 && status < 300,
      headers: freeze({ get, has, entries() { return ownKeys(headers).map((k) => [k, headers[k]]); } }),
      text() { return Promise.resolve(body); },
      json() { return new Promise((resolve) => resolve(JSON.parse(body))); },
    });
  };
  roots.push(makeResponse);

  const seen = new Set();
  const stack = roots;
  while (stack.length > 0) {
    const o = stack.pop();
    if ((typeof o !== 'object' && typeof o !== 'function') || o === null || seen.has(o)) continue;
    seen.add(o);
    stack.push(getPrototypeOf(o));
    for (const k of ownKeys(o)) {
      const d = getOwnPropertyDescriptor(o, k);
      if (d === undefined) continue;
      if ('value' in d) stack.push(d.value); else stack.push(d.get, d.set);
    }
    freeze(o);
  }
  return { makeResponse, frozen: seen.size };
})"#;

/// Runtime limits of the realm.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RealmLimits {
    pub max_buffer_size: u64,
    pub loop_iteration_limit: u64,
    pub recursion_limit: usize,
    pub stack_size_limit: usize,
}

/// A built, frozen realm and the handles the runner needs.
pub(crate) struct HardenedRealm {
    pub context: Context,
    pub executor: Rc<GuardedExecutor>,
    pub host: Rc<HostState>,
    #[allow(dead_code)]
    pub console: JsObject,
    pub crypto: JsObject,
    pub fetch: JsObject,
    /// Number of objects frozen at build time (for diagnostics and tests).
    pub frozen_objects: usize,
    /// Compiled wrapper functions by source (validated already), most recent last. Calling a
    /// cached wrapper re-runs the code's top level in a new activation, so every declaration is
    /// fresh; the wrapper itself is frozen and unreachable from guest code.
    pub compiled: Vec<(String, JsObject)>,
}

impl std::fmt::Debug for HardenedRealm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HardenedRealm").field("frozen_objects", &self.frozen_objects).finish_non_exhaustive()
    }
}

impl HardenedRealm {
    pub(crate) fn build(limits: RealmLimits, host: Rc<HostState>) -> JsResult<Self> {
        let executor = Rc::new(GuardedExecutor::default());
        let mut context =
            ContextBuilder::new().host_hooks(Rc::new(SandboxHooks { max_buffer_size: limits.max_buffer_size })).job_executor(executor.clone()).build()?;
        let mut rl = RuntimeLimits::default();
        rl.set_loop_iteration_limit(limits.loop_iteration_limit);
        rl.set_recursion_limit(limits.recursion_limit);
        rl.set_stack_size_limit(limits.stack_size_limit);
        context.set_runtime_limits(rl);
        context.insert_data(host.clone());

        let global = context.global_object();
        for name in REMOVED_GLOBALS {
            global.delete_property_or_throw(JsString::from(*name), &mut context)?;
        }
        let console = make_console(&mut context);
        global.set(js_string!("console"), console.clone(), true, &mut context)?;
        let crypto = make_crypto(&mut context);
        let fetch = make_fetch(&mut context);

        let bootstrap = context.eval(Source::from_bytes(BOOTSTRAP))?;
        let bootstrap = bootstrap.as_callable().ok_or_else(|| JsNativeError::typ().with_message("bootstrap is not callable"))?;
        let host_objects =
            boa_engine::object::builtins::JsArray::from_iter([console.clone().into(), crypto.clone().into(), fetch.clone().into()], &mut context);
        let helpers = bootstrap.call(&JsValue::undefined(), &[host_objects.into()], &mut context)?;
        let helpers = helpers.as_object().ok_or_else(|| JsNativeError::typ().with_message("bootstrap returned no helpers"))?;
        let make_response = helpers.get(js_string!("makeResponse"), &mut context)?;
        let frozen = helpers.get(js_string!("frozen"), &mut context)?.as_number().unwrap_or(0.0) as usize;
        *host.make_response.borrow_mut() = make_response.as_object();
        executor.clear();
        Ok(Self { context, executor, host, console, crypto, fetch, frozen_objects: frozen, compiled: Vec::new() })
    }
}

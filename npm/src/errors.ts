/**
 * Typed errors of the Crucible package. Every error a user can catch is a `CrucibleError`
 * with a stable `code`; subclasses add the fields their callers branch on.
 */

import type { RunUsage } from '../wasm/crucible_core.js';

/** Stable machine-readable error codes. Add, never rename. */
export type CrucibleErrorCode =
  | 'provider_http'
  | 'provider_timeout'
  | 'provider_network'
  | 'provider_protocol'
  | 'aborted'
  | 'max_turns_exceeded'
  | 'max_steps_exceeded'
  | 'structured_output_invalid'
  | 'invalid_config'
  | 'invalid_argument'
  /** `agent.resume`: no such paused run, or its state does not fit this agent. */
  | 'invalid_resume'
  /** A stored run state this build cannot read. */
  | 'invalid_state'
  | 'store_error'
  | 'store_quota'
  | 'store_blocked'
  /** A stored record is unreadable, of the wrong kind, or written by a newer version. */
  | 'store_corrupt'
  | 'sandbox_error'
  | 'tool_error'
  /** Calling a forged tool (`agent.tools.call`), as the tool call's failure code says. */
  | 'unknown_tool'
  | 'invalid_arguments'
  | 'invalid_output'
  | 'denied'
  | 'execution_failed'
  /** A host tool's result was too large to take in (over 16 Mi characters of JSON). */
  | 'result_too_large'
  | 'sandbox_timeout'
  | 'sandbox_memory'
  | 'sandbox_rejected'
  /** The sandbox could not run a forged tool's code at all: its queue was full
   *  (`maxQueued`), its Workers failed to start, or it was closed. Nothing of the code ran. */
  | 'sandbox_unavailable'
  /** Registry operations (`agent.emergent.*`). */
  | 'emergent_disabled'
  | 'tool_not_found'
  | 'lowest_tier'
  | 'no_such_version'
  /** `rollback` above the session tier to a version that never passed that tier's review. */
  | 'unreviewed_version'
  /** `rollback` to a compose version that would call itself through the tools it calls now. */
  | 'pipeline_cycle'
  | 'no_such_approval'
  | 'invalid_promotion'
  | 'invalid_package'
  /** A `returns` Standard Schema's own check threw (a bug in it or its library, not the model's answer). */
  | 'output_check_failed'
  /** The agent was closed (`agent.close()`); create a new one. */
  | 'closed'
  /** `agent.tools.call` while `emergent.maxCallsWaiting` (default 1024) calls of the agent
   *  wait already: most often a host tool calling back, after an `await`, a forged tool that
   *  reaches it again (every call it is nested in fails with it too). */
  | 'too_many_calls'
  /** `createAgent`: the core's wasm could not be fetched or compiled (a network failure, a URL
   *  answering something else, a Content-Security-Policy without 'wasm-unsafe-eval'). The
   *  next `createAgent` tries again. */
  | 'core_unavailable'
  | 'internal';

/** Base class of every error Crucible throws. Branch on `code`, not on message text. */
export class CrucibleError extends Error {
  readonly code: CrucibleErrorCode;
  // Declared, not a field: a field would be an own `cause` set to undefined on every error.
  declare readonly cause?: unknown;

  constructor(code: CrucibleErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options?.cause !== undefined ? { cause: options.cause } : undefined);
    this.name = 'CrucibleError';
    this.code = code;
  }
}

/** A model provider failed: HTTP status, network failure, timeout or a malformed response. */
export class ProviderError extends CrucibleError {
  /** HTTP status when the server answered; undefined for network errors and timeouts. */
  readonly status: number | undefined;
  /**
   * Whether the caller may retry the same request: it may succeed (408, 409, 429, 5xx, network
   * errors; a server's `x-should-retry` decides where sent) and nothing of the answer was
   * delivered. A failure after part of the answer streamed is `false`, since a retry would
   * deliver that part again.
   */
  readonly retryable: boolean;
  /** Provider id, e.g. `openai:qwen`. */
  readonly provider: string;
  /** Response body excerpt (bounded) for diagnosis. */
  readonly body: string | undefined;
  /**
   * The wait the server asked for in `Retry-After`, in ms, when it gave one. The provider waits
   * it out between retries up to `retry.maxDelayMs`; a longer one ends the call at once with
   * this error, so a caller can schedule the next try itself.
   */
  readonly retryAfterMs: number | undefined;

  constructor(
    code: Extract<CrucibleErrorCode, `provider_${string}`>,
    message: string,
    details: { provider: string; status?: number; retryable?: boolean; body?: string; retryAfterMs?: number; cause?: unknown },
  ) {
    super(code, message, { cause: details.cause });
    this.name = 'ProviderError';
    this.provider = details.provider;
    this.status = details.status;
    this.retryable = details.retryable ?? false;
    this.body = details.body;
    this.retryAfterMs = details.retryAfterMs;
  }
}

/** A store operation failed (I/O, quota, a blocked IndexedDB upgrade). */
export class StoreError extends CrucibleError {
  constructor(code: Extract<CrucibleErrorCode, `store_${string}`>, message: string, options?: { cause?: unknown }) {
    super(code, message, options);
    this.name = 'StoreError';
  }
}

/** The run was aborted through its `AbortSignal`. From `run()` and `resume()`, `cause` is that
 *  signal's reason: a `TimeoutError` from `AbortSignal.timeout`, or what was passed to `abort()`. */
export class AbortError extends CrucibleError {
  /** The aborted run, when a run was aborted (`agent.run`/`resume`): resume it by this id. */
  readonly runId: string | undefined;
  /** What the aborted run had used up to the abort; `undefined` for a `resume()` aborted before
   *  it read the run's state (it ran nothing, and its usage stays with the stored run). */
  readonly usage: RunUsage | undefined;
  constructor(message = 'The run was aborted', options?: { cause?: unknown; runId?: string; usage?: RunUsage }) {
    super('aborted', message, options);
    this.name = 'AbortError';
    this.runId = options?.runId;
    this.usage = options?.usage;
  }
}

/** The sandbox host could not start or was misconfigured (guest failures are results, not errors). */
export class SandboxError extends CrucibleError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('sandbox_error', message, options);
    this.name = 'SandboxError';
  }
}

/** The longest delay timers honour (2^31 - 1 ms, about 24.8 days); a longer one fires at once. */
export const MAX_TIMER_MS = 2_147_483_647;

/** Whether `value` is a thenable: a promise of any realm, or any object with a `then` method,
 *  which `await` would adopt (an `instanceof Promise` check misses both). */
export function isThenable(value: unknown): value is PromiseLike<unknown> {
  return (typeof value === 'object' || typeof value === 'function') && value !== null && typeof (value as { then?: unknown }).then === 'function';
}

/** Whether `value` is a plain object (not null, not an array): what option bags must be. */
export function isRecord(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}

/** The kind of a bad argument, for an error message: `null`, `an array`, else its `typeof`. */
export function describeType(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return typeof value;
}

/**
 * The `invalid_config` naming the options in `given` that `known` does not have, if any; an
 * option `aliases` knows (a spelling from another SDK, say) says what it is called here.
 */
export function unknownOptionsError(given: object, known: Iterable<string>, where: string, aliases: Readonly<Record<string, string>> = {}): CrucibleError | undefined {
  const names = new Set(known);
  const unknown = Object.keys(given).filter((k) => !names.has(k));
  if (unknown.length === 0) return undefined;
  const named = unknown.map((k) => (Object.hasOwn(aliases, k) ? `${k} (did you mean ${aliases[k]}?)` : k));
  return new CrucibleError('invalid_config', `${where}: unknown option${unknown.length > 1 ? 's' : ''} ${named.join(', ')}; the options are ${[...names].join(', ')}`);
}

/** A bad argument as an error message shows it: a number, boolean or short string as written,
 *  anything else by its kind ({@link describeType}). */
export function describeValue(value: unknown): string {
  if (typeof value === 'number' || typeof value === 'boolean') return String(value);
  if (typeof value === 'string') return JSON.stringify(value.length > 60 ? `${value.slice(0, 60)}…` : value);
  return describeType(value);
}

/** What a thrown value says, whatever it is: a thrown object without a prototype makes
 *  `String()` throw too, and the error being built would be lost to that `TypeError`. */
export function messageOf(error: unknown): string {
  try {
    return error instanceof Error ? error.message : String(error);
  } catch {
    return 'what was thrown cannot be shown';
  }
}

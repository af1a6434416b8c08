/**
 * The options of the agent's methods (runs, resumes, registry calls, `close`), and how their
 * arguments are read (once each) and checked before the core sees them.
 */
import { AbortError, CrucibleError, describeType, describeValue, isRecord, messageOf } from '../errors.js';
import type { ForgeTestCase } from '../emergent/types.js';
import { hasLoneSurrogate } from '../stores/values.js';
import { toJsonSchema, type StandardJsonSchemaLike } from '../tool.js';

// Run and resume options are checked like createAgent's: a misspelt `sesionId` would otherwise
// run in the `"default"` session, without a word.
export const RUN_OPTION_NAMES: ReadonlySet<string> = new Set(Object.keys({ signal: true, sessionId: true, scope: true } satisfies Record<keyof RunOptions, true>));
export const RESUME_OPTION_NAMES: ReadonlySet<string> = new Set(Object.keys({ approvals: true, signal: true } satisfies Record<keyof ResumeOptions, true>));

/** Per-run options. */
export interface RunOptions {
  /** Aborts the run: the in-flight model request, and the step's tool calls, which are
   *  abandoned if they ignore it (the run ends `aborted` at once, their results discarded).
   *  Calls a human approved finish first, so their results are saved and never run twice. */
  signal?: AbortSignal;
  /** Conversation to continue (default `"default"`). Each session remembers its messages. */
  sessionId?: string;
  /** Scope label (a task id, say) the run's `forge_tool` attempts are tagged with in
   *  `forge.start`, `forge.registered`, `forge.rejected` and the audit trail, unless a request
   *  gives its own `scope`, as `agent.forge(request, { scope })` tags a direct forge. Kept in
   *  the run's state: a resumed run keeps it. */
  scope?: string;
}

/** A human decision on a pending tool call. */
export interface ApprovalDecision {
  id: string;
  approved: boolean;
  /** Why it was denied; the model sees it. */
  reason?: string;
}

/** Options of {@link Agent.resume}. */
export interface ResumeOptions {
  approvals?: ApprovalDecision[];
  signal?: AbortSignal;
}

/** Options of {@link Agent.close}. */
export interface CloseOptions {
  /**
   * How long to wait for the store to take the buffered tool stats, in ms; past it `close()`
   * goes on (the agent is let go all the same) and rejects with a `StoreError`. A store that
   * never answers would otherwise hold `close()`, and the agent id with it, for good.
   * Default 10000; at most 2147483647 (about 24.8 days), the longest timer hosts keep.
   */
  flushTimeoutMs?: number;
}

/** Session options of registry calls. */
export interface SessionOptions {
  sessionId?: string;
}

/** Options of `agent.tools.call`. */
export interface CallOptions extends SessionOptions {
  /** Aborts the call (a sandboxed tool's execution with it; host tools a pipeline reaches get
   *  the signal); it rejects with `AbortError`. */
  signal?: AbortSignal;
}

/** Options of `agent.forge`. */
export interface ForgeOptions extends SessionOptions {
  /** Aborts the forge while its request is checked, tested and judged: its sandbox tests are
   *  stopped, the judge's request and the host tools its tests call get the signal, nothing is
   *  recorded, and `forge` rejects with `AbortError`. Once the verdict is in, the forge
   *  finishes (and resolves). */
  signal?: AbortSignal;
  /** A label grouping attempts (a task id, say). It tags the attempt's events (`forge.start`,
   *  `forge.rejected`), its audit entries and the tool's provenance; a `scope` in the request
   *  wins. */
  scope?: string;
}

/** Options of `agent.emergent.requestPromotion`. */
export interface PromotionOptions extends SessionOptions {
  /** Aborts the promotion while its tests re-run and its panel reviews it: the tests' host
   *  tools and the judge's request get the signal, nothing is recorded (the tool stays where it
   *  was, and no rejection is remembered), and `requestPromotion` rejects with `AbortError`.
   *  Once the panel approved, the promotion finishes. */
  signal?: AbortSignal;
}

/** Options of `agent.emergent.import`. */
export interface ImportOptions extends SessionOptions {
  /** Test cases for a package that carries none (agentos packages never do); a package with
   *  cases of its own re-runs those and refuses these (`invalid_package`). */
  testCases?: ForgeTestCase[];
  /** Aborts the import while its tests run and its judge reviews it (a slow model may take
   *  minutes): the judge's request and the tests' host tools get the signal, nothing is
   *  recorded, and `import` rejects with `AbortError`. Once the verdict is in, it finishes. */
  signal?: AbortSignal;
}

/**
 * A string argument as the core takes it; anything else is a typed error here. The binding
 * does not check: a number where it expects a string reads wasm memory out of bounds.
 */
export function requireString(value: unknown, what: string): string {
  if (typeof value !== 'string') throw notString(value, what);
  return value;
}

/** The error for `value` where a string was needed. */
export function notString(value: unknown, what: string, code: 'invalid_argument' | 'invalid_config' = 'invalid_argument'): CrucibleError {
  return new CrucibleError(code, `${what} must be a string, got ${describeType(value)}`);
}

/**
 * `resume`'s approvals, checked and copied field by field (each read once): the core's
 * refusal of a misshapen one names a position in JSON text the caller never wrote. `null`
 * is none, as an absent option.
 */
export function checkedApprovals(approvals: unknown): ApprovalDecision[] | undefined {
  if (approvals === undefined || approvals === null) return undefined;
  const wrong = (what: string, expected: string, value: unknown) => new CrucibleError('invalid_config', `agent.resume: ${what} must be ${expected}, got ${describeValue(value)}`);
  if (!Array.isArray(approvals)) throw wrong('approvals', 'an array of { id, approved, reason? }', approvals);
  // Array.from: a hole of a sparse array is a decision too (map() skips holes).
  return Array.from(approvals, (decision: unknown, i) => {
    if (!isRecord(decision)) throw wrong(`approvals[${i}]`, 'an object { id, approved, reason? }', decision);
    const { id, approved, reason } = decision;
    if (typeof id !== 'string') throw wrong(`approvals[${i}].id`, 'a string', id);
    if (typeof approved !== 'boolean') throw wrong(`approvals[${i}].approved`, 'true or false', approved);
    if (reason !== undefined && reason !== null && typeof reason !== 'string') throw wrong(`approvals[${i}].reason`, 'a string', reason);
    return typeof reason === 'string' ? { id, approved, reason } : { id, approved };
  });
}

/** `import`'s `testCases` as the core takes them: a list, or none for `undefined` and `null`
 *  (absent, as elsewhere). Checked here, since the core's refusal of another kind names a
 *  position in JSON text the caller never wrote. */
export function importTestCases(testCases: unknown): ForgeTestCase[] | undefined {
  if (testCases === undefined || testCases === null) return undefined;
  if (!Array.isArray(testCases)) throw new CrucibleError('invalid_argument', `import: testCases must be an array of test cases, got ${describeValue(testCases)}`);
  // The cases themselves are read as a forge request's are, however messy.
  return testCases as ForgeTestCase[];
}

/**
 * A forge request with its Standard Schemas (Zod's `z.object(…)`, as `tool()` takes) written as
 * the JSON Schema they produce: as the object it is, a schema would reach the core as its
 * library's internals. One that cannot be written so is left for the forge to refuse.
 */
export function withJsonSchemas<R>(request: R): R {
  if (!isRecord(request)) return request;
  const standard = (value: unknown) => (isRecord(value) || typeof value === 'function') && '~standard' in value;
  const fields = ['inputSchema', 'outputSchema'].filter((field) => standard(request[field]));
  if (fields.length === 0) return request;
  const converted: Record<string, unknown> = { ...request };
  for (const field of fields) {
    try {
      converted[field] = toJsonSchema(request[field] as StandardJsonSchemaLike, `forge: ${field}`);
    } catch {
      // Left as it is.
    }
  }
  return converted as R;
}

/** The session an option names (`"default"` when it names none). */
export function sessionOf(sessionId: unknown, what = 'sessionId', code: 'invalid_argument' | 'invalid_config' = 'invalid_argument'): string {
  const wrong = wrongSessionId(sessionId, what, code);
  if (wrong) throw wrong;
  return (sessionId as string | undefined) ?? 'default';
}

/** Why `sessionId` names no session, or `undefined` when it does (absent: the default one). */
export function wrongSessionId(sessionId: unknown, what: string, code: 'invalid_argument' | 'invalid_config'): CrucibleError | undefined {
  if (sessionId === undefined) return undefined;
  if (typeof sessionId !== 'string') return notString(sessionId, what, code);
  // The core reads a lone surrogate as U+FFFD, so "u\uD800" and "u\uDC00" (two users' names cut
  // with `slice`) would share one session's history and session-tier tools.
  if (hasLoneSurrogate(sessionId)) {
    return new CrucibleError(code, `${what} ${JSON.stringify(sessionId)} has a lone UTF-16 surrogate; it names a session, so it must be well-formed text`);
  }
  return undefined;
}

/**
 * The `invalid_config` for options that threw when read (a getter, a Proxy trap), with what
 * they threw as its `cause`. Methods that answer with a promise or a stream fail through it:
 * a throw where the call was made would escape a caller's `.catch` and `for await`.
 */
export function unreadableOptions(error: unknown, where: string, code: 'invalid_config' | 'invalid_argument' = 'invalid_config'): CrucibleError {
  if (error instanceof CrucibleError) return error;
  return new CrucibleError(code, `${where}: the options could not be read: ${messageOf(error)}`, { cause: error });
}

/** {@link notSignal} for a run's options, whose reading of the signal's fields may throw too. */
export function readSignal(signal: unknown, what: string): CrucibleError | undefined {
  try {
    return notSignal(signal, what, 'invalid_config');
  } catch (error) {
    return unreadableOptions(error, what);
  }
}

/** `signal` checked for the bindings, which take any object for an `AbortSignal`; an already
 *  aborted one rejects before anything starts. */
export function abortSignal(signal: unknown, what: string): AbortSignal | undefined {
  if (signal === undefined) return undefined;
  let aborted: boolean;
  try {
    const wrong = notSignal(signal, what);
    if (wrong) throw wrong;
    aborted = (signal as AbortSignal).aborted;
  } catch (error) {
    throw unreadableOptions(error, what, 'invalid_argument');
  }
  if (aborted) throw new AbortError(`the ${what} was aborted before it started`);
  return signal as AbortSignal;
}

/**
 * A copy of a method's options, each read once: options that throw as they are read (a
 * getter, a Proxy trap) are the caller's `invalid_argument`, not an `internal` failure of the
 * method. `undefined` and `null` are no options.
 */
export function readOptions<T extends object, K extends keyof T & string>(options: T | undefined | null, what: string, keys: readonly K[]): Partial<Pick<T, K>> {
  const read: Partial<Pick<T, K>> = {};
  if (options === undefined || options === null) return read;
  try {
    // Read as `options.key` reads it: an inherited getter counts, as before.
    for (const key of keys) read[key] = options[key];
  } catch (error) {
    throw unreadableOptions(error, what, 'invalid_argument');
  }
  return read;
}

/** The error for a `signal` option that is not an AbortSignal, or `undefined` when it is one
 *  (or absent). Duck-typed: a signal from another realm (an iframe, jsdom) is not an instance
 *  of this one's. */
function notSignal(signal: unknown, what: string, code: 'invalid_argument' | 'invalid_config' = 'invalid_argument'): CrucibleError | undefined {
  if (signal === undefined) return undefined;
  const s = signal as Partial<AbortSignal> | null;
  if (typeof s?.aborted === 'boolean' && typeof s.addEventListener === 'function') return undefined;
  return new CrucibleError(code, `${what}: signal must be an AbortSignal, got ${describeType(signal)}`);
}

/**
 * The public agent API: `createAgent()`, `agent.stream()` (an `AsyncIterable` of typed events)
 * and `agent.run()` (a thin collector over the stream). The loop itself runs in the wasm core;
 * this file adapts providers and host tools to it and owns per-run abort signals.
 */
import type { RunUsage } from '../wasm/crucible_core.js';
import { loadCore } from './core.js';
import { linkSignals, sharedController } from './signals.js';
import { AbortError, CrucibleError, describeType, describeValue, isRecord, isThenable, messageOf, StoreError, type CrucibleErrorCode } from './errors.js';
import type { ModelProvider, ModelRequest, ToolChoice } from './providers/types.js';
import type { ExecuteOptions, SandboxRequest, SandboxResult } from './sandbox/types.js';
import type { Store } from './stores/types.js';
import { hasLoneSurrogate } from './stores/values.js';
import { DEFAULT_JUDGE_TIMEOUT_MS, judgeStream, MAX_JUDGE_TIMEOUT_MS } from './emergent/judge.js';
import { ClosableStream } from './providers/closable.js';
import type { AuditEntry, ForgeRequest, ForgeResult, ForgeStats, ForgeTestCase, PromotionOutcome, Tier, ToolInfo } from './emergent/types.js';
import { argumentParsers, isApprovalRule, refuseNonObjectArguments, SchemaIssues, standardParser, then, toJsonSchema, type HostTool, type InferSchemaOutput, type JsonSchema, type StandardJsonSchemaLike } from './tool.js';

export type { RunUsage, Usage, PendingApproval, StoredRun, Value } from '../wasm/crucible_core.js';
import type { ErrorInfo as CoreErrorInfo, EventBody as CoreEventBody, PendingApproval, StoredRun, ToolFailure as CoreToolFailure } from '../wasm/crucible_core.js';

// The core's types say `code: string`: its codes are made in many places (some come from the
// host: a provider's, a store's), and this package's list of them is `CrucibleErrorCode`. The
// event types below are the core's with that list in place of `string`, so a `switch` on a
// code is checked; the core's codes are kept within it (unknown ones become `provider_protocol`,
// `store_error`, `execution_failed`).

/** A typed error as carried by events (`agent.error`): stable `code`, readable `message`, and
 *  for a provider's HTTP error its `status`. */
export type ErrorInfo = Omit<CoreErrorInfo, 'code'> & { code: CrucibleErrorCode };
/** Why a tool call produced an error result instead of output (`tool.execute.error`). The
 *  model sees `code` and `message`; the loop goes on. */
export type ToolFailure = Omit<CoreToolFailure, 'code'> & { code: CrucibleErrorCode };
/** What happened: the core's event, its error's `code` typed (see {@link ErrorInfo}). */
export type EventBody = CoreEventBody extends infer E
  ? E extends { type: 'agent.error' }
    ? Omit<E, 'error'> & { error: ErrorInfo }
    : E extends { type: 'tool.execute.error' }
      ? Omit<E, 'error'> & { error: ToolFailure }
      : E
  : never;
/** An event of a run, tagged by `type`; `runPath` lists the run ids from the outermost run to
 *  this one. */
export type AgentEvent = EventBody & { runId: string; runPath: string[] };

/** The signal of host tool calls made outside a run (nothing can abort them); one shared
 * instance, since creating an AbortController per call shows up in call latency. */
const NEVER_ABORTED: AbortSignal = new AbortController().signal;

/** Longest text (in UTF-16 units) that enters the core's memory from one value: a host tool's
 *  JSON result (whatever `maxResultBytes` says), a call's arguments, a forge request, a run's
 *  input. Wasm memory never shrinks, so a tool returning 500 MB would keep the instance, every
 *  agent of this process or page, that large for good. */
const MAX_UNITS_INTO_CORE = 16 * 2 ** 20;

/** A value as the JSON text the core reads (`undefined` stays `undefined`), measured here,
 *  before the core copies it in: wasm memory never shrinks. `refuse` makes the error for a
 *  value with no JSON form (`why`) or one past {@link MAX_UNITS_INTO_CORE} (`units`). */
function measuredJson(value: unknown, refuse: (why: string, units?: number) => Error): string | undefined {
  if (value === undefined) return undefined;
  let text: string | undefined;
  try {
    text = JSON.stringify(value);
  } catch (error) {
    throw refuse(unwritableReason(error));
  }
  if (text === undefined) throw refuse('the value has no JSON form');
  if (text.length > MAX_UNITS_INTO_CORE) throw refuse(`the value is ${text.length} characters of JSON`, text.length);
  return text;
}

/** A tool result as JSON text; a value with no JSON form (a function, a `BigInt`, a cycle)
 *  throws, which makes the call an `execution_failed` result, and text past
 *  {@link MAX_UNITS_INTO_CORE} a `result_too_large` one. */
function jsonText(value: unknown): string | undefined {
  return measuredJson(value, (why, units) =>
    units === undefined
      ? new Error(`the tool returned a value that is not JSON: ${why}`)
      : new CrucibleError('result_too_large', `the tool returned ${units} characters of JSON; the most a host tool may return is ${MAX_UNITS_INTO_CORE}`),
  );
}

/** The JSON text of `agent.tools.call`'s arguments (`undefined` stays `undefined`, which the
 *  core reads as null); a value with no JSON form, or too long, fails the call as arguments the
 *  tool cannot take (`invalid_arguments`). */
function argumentsJson(args: unknown): string | undefined {
  return measuredJson(args, (why, units) =>
    new AgentRunError('invalid_arguments', `arguments: ${why}${units === undefined ? '' : `; at most ${MAX_UNITS_INTO_CORE} are read`}`, ''),
  );
}

/** A tool's value from what `core.callTool` gives: the JSON text of a call that finished at
 *  once, or a promise of the value. */
function valueOf(called: string | Promise<unknown>): unknown {
  return typeof called === 'string' ? JSON.parse(called) : called;
}

/** Why `JSON.stringify` refused a value, in words: for a value nested past its own depth
 *  limit the engine says "Maximum call stack size exceeded", which reads like a crash. */
function unwritableReason(error: unknown): string {
  const message = error instanceof Error ? error.message : describeValue(error);
  return error instanceof RangeError && /call stack/i.test(message) ? 'the value nests too deeply to be written as JSON' : message;
}

/** Options of {@link createAgent}. */
export interface AgentOptions {
  model: ModelProvider;
  /** System instructions. */
  instructions?: string;
  tools?: readonly HostTool[];
  /** Most model turns per run (default 30). */
  maxTurns?: number;
  /** Most tool calls per run, across turns (default 30). */
  maxSteps?: number;
  /** Most tool calls of one step running at once (default 8). */
  maxParallelTools?: number;
  /** Largest serialized tool result passed to the model, in bytes (default 65536). A larger one
   *  is an error result (`result_too_large`), except `forge_tool`'s, which is shortened to fit. */
  maxResultBytes?: number;
  /**
   * JSON Schema (or Standard Schema) the final answer must match; the run's `output` is the
   * parsed value. On turns that offer no tools, an object-rooted schema is also sent as the
   * request's `responseFormat`, so providers that constrain decoding answer in shape.
   */
  returns?: JsonSchema | StandardJsonSchemaLike;
  /** Re-prompts for a final answer that fails `returns` (default 2). */
  maxOutputRetries?: number;
  /** Sampling temperature sent with every model call (finite, 0 or more; absent: the
   *  provider's default). Reasoning models get none (see `openai()`). */
  temperature?: number;
  /** Most tokens of one model answer (at least 1; absent: the provider's default, 4096 for
   *  Anthropic, which requires one). An answer cut off by it ends with `finishReason: 'length'`. */
  maxTokens?: number;
  /**
   * Whether the model may (`auto`, the default), must (`required`, or `{ tool: name }` for one
   * tool) or must not (`none`) call a tool. Holds until the run's first tool call, then later
   * turns are `auto` again (see `resetToolChoice`). A named tool the turn does not offer, or
   * `required` on an agent with no tools, ends the run with `invalid_config`. With a small
   * local model (llama.cpp's server), `'required'` makes `forge_tool` calls complete and
   * parseable (that server constrains a call the model begins; it does not force one); bound
   * such runs with `maxTokens`, since constrained decoding can run on to the context limit.
   */
  toolChoice?: ToolChoice;
  /** Go back to `auto` after the run's first tool call (default `true`); `false` keeps
   * `toolChoice` for every turn, so a `required` run ends only at a limit. */
  resetToolChoice?: boolean;
  /**
   * How much of each session's conversation the agent keeps, and so sends with every run of the
   * session. Past either bound, the oldest whole exchanges (a run's input and everything after
   * it, a `returns` retry's reminder included) are dropped when a run completes; the run's own
   * exchange is kept whole even when it alone is larger. `agent.history(sessionId)` shows what is kept. Every agent of a process
   * shares one wasm memory, so the default bounds each session to 8 MiB of JSON.
   */
  sessionHistory?: SessionHistoryOptions;
  /**
   * Where run states (and, with emergent tools, the registry) are persisted. Agents given the
   * same store object form one runtime: they share the `shared` tier, and a change to it made
   * through one of them is visible to the others at once — in other tabs too when the store
   * has a `broadcastName` (`indexedDbStore` does).
   */
  store?: Store;
  /** Namespaces this agent's records in the store (default `"default"`): 1 to 128 characters,
   *  no `/`. */
  agentId?: string;
  /** Emergent capabilities: the `forge_tool` meta-tool and the tiered registry. */
  emergent?: EmergentOptions;
}

/** Bounds of a session's kept conversation (see {@link AgentOptions.sessionHistory}). */
export interface SessionHistoryOptions {
  /** Most messages kept (at least 1; default: no count bound). */
  maxMessages?: number;
  /** Most bytes of the messages, each written as JSON and added up (at least 1; default 8388608, 8 MiB). */
  maxBytes?: number;
}

/** Something that runs forged JavaScript: `createSandbox()` or a compatible host. */
export interface SandboxHost {
  /** Runs one execution. The core aborts `signal` when it no longer wants the result (the
   *  run was stopped); a host should then end the execution, and may ignore it. */
  execute(request: SandboxRequest, options?: ExecuteOptions): Promise<SandboxResult>;
  close?(): Promise<void>;
}

/** A model that reviews forged tools or promotions. */
export interface JudgeOptions {
  model: ModelProvider;
  /**
   * Most tokens one verdict may take (default 512; a verdict needs about 150). A reasoning
   * model's hidden reasoning counts against it, and a verdict cut off there rejects the forge
   * (or, from the promotion panel, the promotion) with a reason that says so: give a judge on
   * such a model a few thousand.
   */
  maxTokens?: number;
  /**
   * Most milliseconds one review (each of a promotion panel's two reviewers is one) may take,
   * from the request to a complete verdict (default 120000, the built-in providers' own; a
   * whole number from 1 to 2147483647). Past it the provider's signal aborts and the review
   * fails closed with a reason that says the judge did not answer within that time: the forge
   * or import is rejected (category `other`), the promotion not granted. A promotion held up that way is not remembered as refused: the uses
   * that follow do not ask again before `promotionRetryUses` more, but `requestPromotion` may at
   * once. It bounds a provider of your own that never answers, or stalls mid-verdict, too. A
   * slow model given a large `maxTokens` (a reasoning model on modest hardware) may need more.
   */
  timeoutMs?: number;
}

/** Options of emergent capabilities (issue-4 contract). */
export interface EmergentOptions {
  /** Gives the agent the `forge_tool` meta-tool and the tool registry. */
  enabled: boolean;
  /** Reviews every forge. Absent: every forge is rejected (fail-closed). */
  judge?: JudgeOptions;
  /** Reviews promotions (a two-reviewer panel); defaults to `judge`. */
  promotionJudge?: JudgeOptions;
  /** Most forged tools one session holds (default 10); a forge past it is rejected. */
  maxSessionTools?: number;
  /** Most tools in the agent tier (default 50); a promotion past it is refused. */
  maxAgentTools?: number;
  /** Deadline of one execution of forged code (default 5000). For the default sandbox only: a
   *  `sandbox` of your own carries its own limits, and setting this next to it is an error. */
  sandboxTimeoutMs?: number;
  /** Memory budget of the sandbox instance (default 128). Default sandbox only, as above. */
  sandboxMemoryMB?: number;
  /** How long a Worker of the default sandbox may stay idle before it is terminated (default
   *  60000; `Infinity`: kept until `close()`); the next forged code to run starts it again.
   *  Default sandbox only, as above. */
  sandboxIdleTimeoutMs?: number;
  /** A session tool is promoted to the agent tier after `uses` successful calls (default 5)
   *  when its creation verdict's confidence is above `confidence` (default 0.8; equal is not
   *  enough). */
  promotionThreshold?: { uses?: number; confidence?: number };
  /** Promote a session tool to the agent tier by itself once it reaches the threshold (default
   *  true). The call that reaches it returns its result at once; the review (tests re-run, the
   *  panel) goes on in the background: `agent.emergent.settled()` waits for it. */
  autoPromote?: boolean;
  /** Successful uses after a rejected promotion before it is asked again (default 5; a new
   *  version is asked at once). Each rejected version of a tool keeps its count: a rollback to
   *  one (of its last 20) asks again only once the uses it still needed have passed. */
  promotionRetryUses?: number;
  /** Host APIs forged code may ask for (`fetch`, `crypto`; another name is `invalid_config`);
   *  a request's allowlist is intersected with it. Default: none. */
  allowedSandboxAPIs?: readonly string[];
  /** Hosts `fetch` may reach from forged code. Default sandbox only, as above. */
  fetchDomainAllowlist?: readonly string[];
  /** Keep sandbox source in exported packages (a redacted package cannot be imported). */
  persistSandboxSource?: boolean;
  /** Runs forged code. Default: `createSandbox({ lazy: true })` with the limits above (its
   *  Workers start when the agent's first forged code runs). */
  sandbox?: SandboxHost;
  /** Calls between writes of agent- and shared-tier tools' stats to the store (default 16;
   *  they are written at `endSession` and `close()` too). */
  statsFlushEvery?: number;
  /** Most audit-trail entries kept (default 500; the oldest go first, from the store too, and
   *  an agent opened with a smaller capacity than the store's trail keeps its newest). */
  auditCapacity?: number;
  /** Most `agent.tools.call`s of the agent that may wait at once, on host tools or forged code
   *  (default 1024; a whole number from 1); one more rejects with `too_many_calls`. The bound
   *  stops a host tool that, after an `await`, calls back a forged tool reaching it again: that
   *  recursion runs on microtasks alone and grows memory until the process dies. Raise it for
   *  a larger burst of calls at once (`Promise.all` over thousands of calls that wait on async
   *  host tools). The default sandbox queues as many executions of forged code (a sandbox of
   *  your own, `emergent.sandbox`, its own `maxQueued`), so a burst this bound lets through is
   *  not turned away there as `sandbox_unavailable`. */
  maxCallsWaiting?: number;
}

/** The option names of {@link AgentOptions} and {@link EmergentOptions}, for refusing the
 *  misspelled or foreign ones (`system` from another SDK) instead of ignoring them. */
// Written as records over the interfaces' keys, so an option added to an interface and not
// here is a type error rather than a refused option.
const AGENT_OPTION_NAMES: ReadonlySet<string> = new Set(
  Object.keys({
    model: true, instructions: true, tools: true, maxTurns: true, maxSteps: true, maxParallelTools: true, maxResultBytes: true, returns: true,
    maxOutputRetries: true, temperature: true, maxTokens: true, toolChoice: true, resetToolChoice: true, store: true, agentId: true, emergent: true,
    sessionHistory: true,
  } satisfies Record<keyof AgentOptions, true>),
);
const SESSION_HISTORY_KINDS: Readonly<Record<keyof SessionHistoryOptions, OptionKind>> = { maxMessages: 'count', maxBytes: 'wide' };
const SESSION_HISTORY_NAMES: ReadonlySet<string> = new Set(Object.keys(SESSION_HISTORY_KINDS));
const EMERGENT_OPTION_NAMES: ReadonlySet<string> = new Set(
  Object.keys({
    enabled: true, judge: true, promotionJudge: true, maxSessionTools: true, maxAgentTools: true, sandboxTimeoutMs: true, sandboxMemoryMB: true, sandboxIdleTimeoutMs: true,
    promotionThreshold: true, autoPromote: true, promotionRetryUses: true, allowedSandboxAPIs: true, fetchDomainAllowlist: true,
    persistSandboxSource: true, sandbox: true, statsFlushEvery: true, auditCapacity: true, maxCallsWaiting: true,
  } satisfies Record<keyof EmergentOptions, true>),
);
/** The largest `maxTokens` the core takes (a u32), and so the largest a judge's may be. */
const MAX_U32 = 2 ** 32 - 1;
const JUDGE_OPTION_NAMES: ReadonlySet<string> = new Set(Object.keys({ model: true, maxTokens: true, timeoutMs: true } satisfies Record<keyof JudgeOptions, true>));
/**
 * The shape of each option the core reads as JSON. serde's error for a wrong one names a
 * position in JSON text the caller never wrote ("expected u32 at line 1 column 35"), so the
 * kinds are checked here first and the error names the option; ranges past the kind (`maxTurns`
 * at least 1, …) stay the core's to check, and its messages name the option already.
 * `whole`: a u32 (the core's `usize` is one on wasm32); `wide`: a u64 (to 2^53 - 1 here);
 * `count`: a u32 from 1, for a bound where 0 would refuse everything (`maxTurns`; and
 * `maxCallsWaiting`, which the host keeps and the core never sees), so the message states the
 * range the option really has.
 */
type OptionKind = 'whole' | 'count' | 'wide' | 'number' | 'boolean' | 'string';
const AGENT_OPTION_KINDS: Readonly<Partial<Record<keyof AgentOptions, OptionKind>>> = {
  instructions: 'string', maxTurns: 'count', maxSteps: 'whole', maxParallelTools: 'count', maxResultBytes: 'count', maxOutputRetries: 'whole',
  temperature: 'number', maxTokens: 'count', resetToolChoice: 'boolean', agentId: 'string',
};
const EMERGENT_OPTION_KINDS: Readonly<Partial<Record<keyof EmergentOptions, OptionKind>>> = {
  enabled: 'boolean', maxSessionTools: 'whole', maxAgentTools: 'whole', autoPromote: 'boolean', promotionRetryUses: 'wide',
  persistSandboxSource: 'boolean', statsFlushEvery: 'whole', auditCapacity: 'whole', maxCallsWaiting: 'count',
};
type PromotionThreshold = NonNullable<EmergentOptions['promotionThreshold']>;
const THRESHOLD_OPTION_KINDS: Readonly<Record<keyof PromotionThreshold, OptionKind>> = { uses: 'wide', confidence: 'number' };
const THRESHOLD_OPTION_NAMES: ReadonlySet<string> = new Set(Object.keys(THRESHOLD_OPTION_KINDS));

/** Throws `invalid_config` naming the first option of `given` that is not of its kind.
 *  `null` is left to the core, which reads it as absent where an option may be. */
function refuseMistypedOptions(given: Record<string, unknown>, kinds: Readonly<Record<string, OptionKind | undefined>>, where: string): void {
  for (const [name, kind] of Object.entries(kinds)) {
    const value = given[name];
    if (value === undefined || value === null || kind === undefined) continue;
    const max = kind === 'wide' ? Number.MAX_SAFE_INTEGER : MAX_U32;
    const min = kind === 'count' ? 1 : 0;
    const wrong =
      kind === 'whole' || kind === 'wide' || kind === 'count'
        ? !(Number.isInteger(value) && (value as number) >= min && (value as number) <= max) && `a whole number from ${min} to ${max}`
        : kind === 'number'
          ? !(typeof value === 'number' && Number.isFinite(value)) && 'a finite number'
          : kind === 'boolean'
            ? typeof value !== 'boolean' && 'true or false'
            : typeof value !== 'string' && 'a string';
    if (wrong) {
      const shown = typeof value === 'string' || kind !== 'string' ? describeValue(value) : describeType(value);
      throw new CrucibleError('invalid_config', `${where}${name} must be ${wrong}, got ${shown}`);
    }
  }
}

/** Checks the shapes of `createAgent`'s options (as {@link readAgentOptions} read them, unknown
 *  ones refused) the core would otherwise refuse without naming them, or ignore: an `emergent`
 *  that is no object (`emergent: true` would leave emergent capabilities off without a word), a
 *  `sandbox` that is none. */
function refuseMisshapenOptions(options: AgentOptions): void {
  refuseMistypedOptions(options as unknown as Record<string, unknown>, AGENT_OPTION_KINDS, 'createAgent: ');
  const history: unknown = options.sessionHistory;
  if (history !== undefined && history !== null) {
    if (!isRecord(history)) throw new CrucibleError('invalid_config', `createAgent: sessionHistory must be an object such as { maxBytes: 1048576 }, got ${describeType(history)}`);
    refuseMistypedOptions(history, SESSION_HISTORY_KINDS, 'createAgent: sessionHistory.');
  }
  const em: unknown = options.emergent;
  if (em === undefined || em === null) return;
  if (!isRecord(em)) throw new CrucibleError('invalid_config', `createAgent: emergent must be an object such as { enabled: true }, got ${describeType(em)}`);
  refuseMistypedOptions(em, EMERGENT_OPTION_KINDS, 'createAgent: emergent.');
  const threshold = em.promotionThreshold;
  if (threshold !== undefined && threshold !== null) {
    if (!isRecord(threshold)) {
      throw new CrucibleError('invalid_config', `createAgent: emergent.promotionThreshold must be an object { uses, confidence }, got ${describeType(threshold)}`);
    }
    refuseMistypedOptions(threshold, THRESHOLD_OPTION_KINDS, 'createAgent: emergent.promotionThreshold.');
    // A confidence is at most 1: a threshold above it would never promote, without a word.
    const confidence = threshold.confidence;
    if (typeof confidence === 'number' && (confidence < 0 || confidence > 1)) {
      throw new CrucibleError('invalid_config', `createAgent: emergent.promotionThreshold.confidence must be from 0 to 1, got ${describeValue(confidence)}`);
    }
  }
  const sandbox = em.sandbox as { execute?: unknown } | null | undefined;
  if (sandbox !== undefined && typeof sandbox?.execute !== 'function') {
    throw new CrucibleError('invalid_config', `createAgent: emergent.sandbox must be a sandbox such as await createSandbox(), got ${describeType(sandbox)}`);
  }
}

/** Names other SDKs use for an option this one spells differently. */
const OPTION_ALIASES: Readonly<Record<string, string>> = { system: 'instructions', systemPrompt: 'instructions', systemInstructions: 'instructions', maxIterations: 'maxTurns', max_tokens: 'maxTokens' };

/** The `invalid_config` naming the options in `given` that `known` does not have, if any. */
function unknownOptionsError(given: object, known: ReadonlySet<string>, where: string): CrucibleError | undefined {
  const unknown = Object.keys(given).filter((k) => !known.has(k));
  if (unknown.length === 0) return undefined;
  const named = unknown.map((k) => (OPTION_ALIASES[k] ? `${k} (did you mean ${OPTION_ALIASES[k]}?)` : k));
  return new CrucibleError('invalid_config', `${where}: unknown option${unknown.length > 1 ? 's' : ''} ${named.join(', ')}; the options are ${[...known].join(', ')}`);
}

/** Throws {@link unknownOptionsError}'s error when there is one. */
function refuseUnknownOptions(given: object, known: ReadonlySet<string>, where: string): void {
  const error = unknownOptionsError(given, known, where);
  if (error) throw error;
}

/**
 * A copy of an option bag of `createAgent` (`path`: where it is, `''` for the options
 * themselves, else `emergent`, `emergent.judge`…) with each of its `known` options read once,
 * its unknown ones refused; a value that is not an object is left as it is, for the checks
 * that name what it should be. A getter or Proxy trap that throws is the caller's
 * `invalid_config` naming the option, with what it threw as the `cause`, not a raw error out
 * of `createAgent`; and a getter read once cannot answer differently later.
 */
function readOptionBag<T>(given: T, known: ReadonlySet<string>, path: string): T {
  if (!isRecord(given)) return given;
  const where = path ? `createAgent: ${path}` : 'createAgent';
  try {
    refuseUnknownOptions(given, known, where);
  } catch (error) {
    throw unreadableOptions(error, where);
  }
  const copy: Record<string, unknown> = {};
  for (const name of known) {
    try {
      // Read as `given.name` reads it: an inherited getter counts, as before.
      const value = (given as Record<string, unknown>)[name];
      if (value !== undefined) copy[name] = value;
    } catch (error) {
      throw unreadableOption(error, path ? `${path}.${name}` : name);
    }
  }
  return copy as T;
}

/** The `invalid_config` for the option `name` (as `emergent.judge`) that threw when read. */
function unreadableOption(error: unknown, name: string): CrucibleError {
  return new CrucibleError('invalid_config', `createAgent: ${name} could not be read: ${messageOf(error)}`, { cause: error });
}

/** `read()`, which reads into the option `name` (a provider's fields, a schema's): what it
 *  throws besides a `CrucibleError` is {@link unreadableOption} of `name`. */
function readingOption<T>(name: string, read: () => T): T {
  try {
    return read();
  } catch (error) {
    throw error instanceof CrucibleError ? error : unreadableOption(error, name);
  }
}

/** Whether `value` is a model provider (its `stream` a function). */
function isProvider(value: unknown, name: string): boolean {
  return readingOption(name, () => typeof (value as { stream?: unknown } | null | undefined)?.stream === 'function');
}

/** `createAgent`'s options read once, option bags within them too (see {@link readOptionBag}). */
function readAgentOptions(options: AgentOptions): AgentOptions {
  const read = readOptionBag(options, AGENT_OPTION_NAMES, '');
  if (!isRecord(read)) return read;
  read.sessionHistory = readOptionBag(read.sessionHistory, SESSION_HISTORY_NAMES, 'sessionHistory');
  const em = readOptionBag(read.emergent, EMERGENT_OPTION_NAMES, 'emergent');
  if (isRecord(em)) {
    em.judge = readOptionBag(em.judge, JUDGE_OPTION_NAMES, 'emergent.judge');
    em.promotionJudge = readOptionBag(em.promotionJudge, JUDGE_OPTION_NAMES, 'emergent.promotionJudge');
    em.promotionThreshold = readOptionBag(em.promotionThreshold, THRESHOLD_OPTION_NAMES, 'emergent.promotionThreshold');
  }
  read.emergent = em;
  return stripUndefined(read as unknown as Record<string, unknown>) as unknown as AgentOptions;
}

// Run and resume options are checked like createAgent's: a misspelt `sesionId` would otherwise
// run in the `"default"` session, without a word.
const RUN_OPTION_NAMES: ReadonlySet<string> = new Set(Object.keys({ signal: true, sessionId: true, scope: true } satisfies Record<keyof RunOptions, true>));
const RESUME_OPTION_NAMES: ReadonlySet<string> = new Set(Object.keys({ approvals: true, signal: true } satisfies Record<keyof ResumeOptions, true>));

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

/** What every {@link RunResult} carries. */
interface RunResultBase {
  runId: string;
  /** Tokens of every model call the run made: its own turns, and the forge judge's reviews of
   *  its model's `forge_tool` calls (under the judge's model id in `byModel`). */
  usage: RunUsage;
  turns: number;
  steps: number;
}

/** A run that ended with a final answer. */
export interface CompletedRun<Output = unknown> extends RunResultBase {
  status: 'completed';
  /** The parsed answer when `returns` is set, else the final text. */
  output: Output;
  text: string;
  pendingApprovals: [];
  /**
   * Why the answer ended, the same across providers: `length` is an answer cut off at the
   * token limit (`maxTokens`, or the server's), `content_filter` one the provider withheld.
   */
  finishReason: FinishReason;
}

/** Why an answer ended (`agent.end`'s `finishReason`, generated from the core). */
export type FinishReason = Extract<EventBody, { type: 'agent.end' }>['finishReason'];

/** A run that paused: tool calls wait for approval; continue with `agent.resume(run, { approvals })`. */
export interface PausedRun extends RunResultBase {
  status: 'paused';
  /** Calls waiting for a decision. */
  pendingApprovals: PendingApproval[];
  /** The resumable state: plain JSON, already persisted when the agent has a store. */
  state: unknown;
  output: undefined;
  text: '';
  finishReason: 'tool_calls';
}

/** A run that ended with a final answer or paused for approvals; tell them apart by `status`. */
export type RunResult<Output = unknown> = CompletedRun<Output> | PausedRun;

/** A run ended without a final answer: a limit, a model error or invalid structured output. */
export class AgentRunError extends CrucibleError {
  readonly runId: string;
  readonly usage: RunUsage | undefined;
  /** The HTTP status of a provider's error response (`provider_http`): 401, 429, 500… */
  readonly status: number | undefined;
  /** `cause`: for a provider's failure, the provider's own `ProviderError` (with `retryable`,
   *  `provider`, `body`), when it threw one. */
  constructor(code: CrucibleErrorCode, message: string, runId: string, usage?: RunUsage, status?: number, cause?: unknown) {
    super(code, message, cause !== undefined ? { cause } : undefined);
    this.name = 'AgentRunError';
    this.runId = runId;
    this.usage = usage;
    this.status = status;
  }
}

type EventListener = (e: AgentEvent) => void;

interface CoreAgentHandle {
  readonly emergentEnabled: boolean;
  /** `callsRunId`: the run id its judge and its tests' host tools get (see `Agent.#direct`). */
  forge(request: unknown, sessionId: string, scope: string | undefined, signal: AbortSignal | undefined, callsRunId: string): Promise<ForgeResult>;
  /** `argsJson`: the arguments' JSON text (`undefined` reads as null). The result's JSON text
   *  when the call finished at once (see {@link valueOf}), else a promise of the result. */
  callTool(name: string, argsJson: string | undefined, sessionId: string, signal: AbortSignal | undefined, runId: string | undefined): string | Promise<unknown>;
  listTools(sessionId: string): ToolInfo[];
  forgeStats(): ForgeStats;
  /** `callsRunId`: the run id its judge and its tests' host tools get (see `Agent.#direct`). */
  requestPromotion(name: string, tier: string, sessionId: string, signal: AbortSignal | undefined, callsRunId: string): Promise<PromotionOutcome>;
  approve(id: string): Promise<ToolInfo>;
  deny(id: string, reason: string): Promise<void>;
  demote(name: string, sessionId: string): Promise<ToolInfo>;
  rollback(name: string, version: number, sessionId: string): Promise<ToolInfo>;
  exportTool(name: string, sessionId: string): string;
  /** `callsRunId`: the run id its judge and its tests' host tools get (see `Agent.#direct`). */
  importTool(pkg: string, sessionId: string, options: { testCases?: ForgeTestCase[] }, signal: AbortSignal | undefined, callsRunId: string): Promise<ForgeResult>;
  pendingApprovals(): PendingApproval[];
  audit(): AuditEntry[];
  flushStats(): Promise<void>;
  /** Resolves once no background work (an automatic promotion) is in flight. */
  settled(): Promise<void>;
  /** Aborts the background work in flight (recording nothing) and starts none after. */
  stopBackground(): void;
  /** Stops the registry's store writes; resolves once those already out have ended. */
  closeWrites(): Promise<void>;
  reloadShared(): Promise<void>;
  run(input: string, runId: string, sessionId: string | undefined, scope: string | undefined, onEvent: EventListener, signal?: AbortSignal): Promise<unknown>;
  resume(runId: string, state: unknown, decisions: ApprovalDecision[] | undefined, onEvent: EventListener, signal?: AbortSignal): Promise<unknown>;
  history(sessionId: string): unknown;
  endSession(sessionId: string): Promise<void>;
  storedRuns(): Promise<StoredRun[]>;
  discardRun(runId: string): Promise<boolean>;
  toolNames(): string[];
  free(): void;
}

/**
 * Agents created with the same `store` object form one runtime: they share the `shared` tier.
 * A shared-tier change made through one agent (approve, demote, rollback) is re-read by the
 * others at once; agents in other tabs hear of it on the store's `broadcastName` (see
 * `sharedTierChannel`), agents in other processes see it when they load.
 */
const runtimes = new WeakMap<object, Set<CoreAgentHandle>>();

/** Agent ids with emergent capabilities open on each store object in this context. */
const openRegistries = new WeakMap<object, Set<string>>();

/** Lets go of what an agent dropped without `close()` held outside itself, once it is
 *  garbage-collected (when is up to the engine): its registry claim, so its id can be opened
 *  again; the sandbox Workers it started (about 28 MB each); its place among the store's
 *  agents and its listeners, which would keep its core (and its wasm memory) for good. */
const unclosedAgents = new FinalizationRegistry<() => void>((release) => release());

/**
 * Claims `agentId` on `store` for one open agent with emergent capabilities: its registry keeps
 * its tools, stats and audit trail in memory and writes them back, so a second writer of the
 * same records (another agent object here, or another tab) would overwrite them. Refused with
 * `store_blocked` when taken; resolves with the release function. `openRegistries` is per store
 * object, enough where each object owns its data (memory, LevelDB); stores whose objects share
 * data (IndexedDB) take `agent:<agentId>` with `tryLock`, which spans all of them.
 */
async function claimRegistry(store: Store, agentId: string): Promise<() => void> {
  const open = openRegistries.get(store) ?? new Set<string>();
  if (open.has(agentId)) {
    throw new StoreError('store_blocked', `agent "${agentId}" already has emergent capabilities open on this store: close it first, or give this agent another agentId`);
  }
  const releaseLock = store.tryLock ? await store.tryLock(`agent:${agentId}`) : () => undefined;
  if (!releaseLock) {
    throw new StoreError('store_blocked', `agent "${agentId}" is already open on this store (in another tab or worker, or through another store object on the same database): close it there, or give this agent another agentId`);
  }
  open.add(agentId);
  openRegistries.set(store, open);
  return () => {
    open.delete(agentId);
    releaseLock();
  };
}

async function reloadSharedTier(store: object | undefined, changedBy: CoreAgentHandle): Promise<void> {
  const agents = store ? runtimes.get(store) : undefined;
  if (!agents) return;
  // Best effort: a sibling that cannot read the store keeps its tier until it loads again.
  await Promise.all([...agents].filter((a) => a !== changedBy).map((a) => a.reloadShared().catch(() => undefined)));
}

/** The message agents post on their store's `broadcastName` after changing the shared tier. */
const SHARED_TIER_CHANGED = 'crucible:shared-tier-changed';

/**
 * Listens on the store's `broadcastName` (other tabs and workers opening the same data) and
 * re-reads the shared tier when one of their agents changed it. `undefined` when the store
 * has no such name or the platform has no `BroadcastChannel`.
 */
function sharedTierChannel(store: Store | undefined, core: CoreAgentHandle): BroadcastChannel | undefined {
  const name = store?.broadcastName;
  if (!name || typeof BroadcastChannel === 'undefined' || !core.emergentEnabled) return undefined;
  const channel = new BroadcastChannel(name);
  channel.onmessage = (event: MessageEvent) => {
    if (event.data === SHARED_TIER_CHANGED) void core.reloadShared().catch(() => undefined);
  };
  // Node: a listening channel must not keep a service alive on its own.
  (channel as { unref?: () => void }).unref?.();
  return channel;
}

/**
 * Tells agents in other tabs and workers that this agent changed the shared tier. The agent
 * may have been closed while the change was written (its channel closed with it): the change
 * is in the store all the same, so they are told through a channel opened for the message.
 */
function announceSharedTierChange(channel: BroadcastChannel | undefined, name: string | undefined): void {
  if (!channel || !name) return;
  try {
    channel.postMessage(SHARED_TIER_CHANGED);
  } catch {
    const once = new BroadcastChannel(name);
    once.postMessage(SHARED_TIER_CHANGED);
    once.close(); // what it posted is delivered all the same
  }
}

/**
 * In a page, writes the agent's buffered tool stats when the page is left: stats go to the
 * store every 16 calls, at `endSession` and at `close()`, and a page reloaded, navigated away
 * from or closed without `close()` would lose the calls since. Both events are needed: a
 * write begun at `pagehide` is lost when the page is reloaded or navigated (Chromium aborts
 * the IndexedDB transactions of the document it unloads; `beforeunload` comes while the page
 * still runs), and `beforeunload` does not fire everywhere a tab is closed (mobile). Returns
 * the listeners' removal; `undefined` outside pages.
 */
function flushOnPageExit(core: CoreAgentHandle): (() => void) | undefined {
  if (!core.emergentEnabled || typeof document === 'undefined' || typeof globalThis.addEventListener !== 'function') return undefined;
  const flush = () => void core.flushStats().catch(() => undefined);
  const events = ['beforeunload', 'pagehide'];
  for (const event of events) globalThis.addEventListener(event, flush);
  return () => {
    for (const event of events) globalThis.removeEventListener(event, flush);
  };
}

/**
 * Ties an agent's core to the world outside it: the store's agents (`runtimes`), the shared
 * tier's channel, the page's `beforeunload` and `pagehide`. `release` lets go of all of it and of what the agent
 * owns, in this order: background work aborted (`background`, the signal its judge and host
 * tool calls get) and waited for, buffered stats written, the core freed (its registry writes
 * nothing more), direct operations still going aborted (`direct`), the sandbox stopped, and
 * only then the id released for a new agent. `close()`
 * calls it, and the finalizer of an agent dropped without `close()`. Made here rather than in
 * the constructor: a closure made there shares its scope with closures that use `this`, so it
 * would keep the agent alive and the finalizer holding it would never run.
 */
function attach(
  core: CoreAgentHandle,
  store: Store | undefined,
  sandbox: SandboxHost | undefined,
  releaseRegistry: (() => void) | undefined,
  background: AbortController | undefined,
  direct: AbortController,
  waitingCalls: Set<(error: CrucibleError) => void>,
) {
  const channel = sharedTierChannel(store, core);
  const stopPageExitFlush = flushOnPageExit(core);
  if (store && core.emergentEnabled) {
    const agents = runtimes.get(store) ?? new Set<CoreAgentHandle>();
    agents.add(core);
    runtimes.set(store, agents);
  }
  const release = async (flushTimeoutMs = DEFAULT_CLOSE_FLUSH_TIMEOUT_MS): Promise<void> => {
    // The stats that could not be written are lost with the core: told to the caller of
    // close() once everything else is let go.
    let unflushed: unknown;
    try {
      if (store) runtimes.get(store)?.delete(core);
      channel?.close();
      stopPageExitFlush?.();
      if (core.emergentEnabled) {
        // An automatic promotion under review records nothing (its judge's request aborted
        // too); one whose panel approved commits, before the stats are written after it.
        core.stopBackground();
        background?.abort(new AbortError('the agent was closed'));
        const late = () => new StoreError('store_error', `close(): the store did not take the buffered tool stats within ${flushTimeoutMs} ms; they are not written`);
        const deadline = performance.now() + flushTimeoutMs;
        const written = core.settled().then(() => core.flushStats());
        await withinMs(written, flushTimeoutMs, late).catch((error: unknown) => (unflushed = error ?? new Error('the stats flush failed')));
        // An approval, demotion or rollback whose write is out lands before the agent id is
        // handed on: the next agent opened with it must read it, not have it land among its
        // records (where the same approval could be granted twice). Within the flush's time: a
        // store that never answers holds close() for `flushTimeoutMs` in all, not twice that.
        const stuck = () => new StoreError('store_error', `close(): a registry write the store had not finished within ${flushTimeoutMs} ms may still land`);
        await withinMs(core.closeWrites(), Math.max(0, deadline - performance.now()), stuck).catch((error: unknown) => (unflushed ??= error));
      }
    } finally {
      // Whatever failed above, the core and the agent id are let go. The core first: once
      // freed its registry writes nothing, and stopping the sandbox ends the executions of a
      // forge still in flight, which would then record its rejection.
      core.free();
      // Then the direct operations (forge, import, requestPromotion, a call with a signal)
      // still going: their judge's request or host tool stops, and, the core being freed,
      // they end as `closed` rather than waiting for an answer nobody will record.
      direct.abort(new AbortError('the agent was closed'));
      // And the tool calls made without a signal still waiting (for a host tool that may never
      // answer): the core holds their promise, not a signal it could abort.
      for (const reject of waitingCalls) reject(closedWhileCalling());
      waitingCalls.clear();
      try {
        await sandbox?.close?.();
      } finally {
        releaseRegistry?.();
      }
    }
    if (unflushed !== undefined) throw unflushed;
  };
  // For the finalizer: made here, for the reason above.
  const letGo = () => void release().catch(() => undefined);
  return { channel, release, letGo };
}

/** The host APIs the sandbox can give forged code (`allowedSandboxAPIs`, a request's allowlist). */
const SANDBOX_APIS = ['fetch', 'crypto'];

/** Throws `invalid_config` for an `allowedSandboxAPIs` that is no list of known API names: a
 *  misspelt one (`'Fetch'`) would grant nothing, and forged code would fail for a reason the
 *  configuration hides. */
function refuseUnknownSandboxApis(apis: unknown): void {
  if (apis === undefined) return;
  // Array.from: a hole of a sparse array is an element too (filter() skips holes).
  const unknown = Array.isArray(apis) ? Array.from(apis).filter((api) => !SANDBOX_APIS.includes(api as string)) : [apis];
  if (unknown.length > 0) {
    const named = unknown.map((api) => (typeof api === 'string' ? JSON.stringify(api) : describeType(api))).join(', ');
    throw new CrucibleError('invalid_config', `createAgent: emergent.allowedSandboxAPIs must list host APIs the sandbox has (${SANDBOX_APIS.join(', ')}); it names ${named}`);
  }
}

/**
 * Most `agent.tools.call`s of one agent that may wait (on a host tool, or forged code) at once,
 * unless `emergent.maxCallsWaiting` says otherwise. A host tool that calls a forged tool back
 * after an `await`, when that tool reaches the host tool again, recursed without end: every
 * level waits on the next, and on microtasks alone the event loop never got a turn (no timer,
 * no abort fired) while memory grew until the process died. No platform tells which call an
 * `await`ed call is made inside, so the depth is bounded through what it makes: the calls
 * waiting.
 */
const DEFAULT_MAX_CALLS_WAITING = 1024;

/** Throws `too_many_calls` when `max` calls wait already. */
function refuseTooManyWaiting(waitingCalls: ReadonlySet<unknown>, max: number): void {
  if (waitingCalls.size < max) return;
  throw new CrucibleError(
    'too_many_calls',
    `tools.call: ${max} calls of this agent are waiting already (emergent.maxCallsWaiting; a host tool that calls back a forged tool reaching it again recurses without end; else make fewer calls at once, or raise it)`,
  );
}

/** The `closed` error of a `tools.call` that `close()` cut off (`cause`: how it failed then). */
function closedWhileCalling(cause?: unknown): CrucibleError {
  return new CrucibleError('closed', 'tools.call: the agent was closed while the call ran (its sandbox and host tools are let go)', { cause });
}

/** How long `close()` waits for the store to take the buffered stats (`flushTimeoutMs`). */
const DEFAULT_CLOSE_FLUSH_TIMEOUT_MS = 10_000;

/** `promise`, or the error `late()` makes once `ms` pass first. */
function withinMs<T>(promise: Promise<T>, ms: number, late: () => Error): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(late()), ms);
  });
  return Promise.race([promise, deadline]).finally(() => clearTimeout(timer));
}

/** Options of {@link Agent.close}. */
export interface CloseOptions {
  /**
   * How long to wait for the store to take the buffered tool stats, in ms; past it `close()`
   * goes on (the agent is let go all the same) and rejects with a `StoreError`. A store that
   * never answers would otherwise hold `close()`, and the agent id with it, for good.
   * Default 10000.
   */
  flushTimeoutMs?: number;
}

let runCounter = 0;
function newRunId(): string {
  const random = typeof crypto !== 'undefined' && 'randomUUID' in crypto ? crypto.randomUUID().slice(0, 8) : Math.random().toString(16).slice(2, 10);
  return `run_${random}${(++runCounter).toString(36)}`;
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

/** Routes events: run events to their stream, registry events to the stream of the run that
 * caused them, and every event to `agent.on` listeners. */
class EventHub {
  readonly listeners = new Set<EventListener>();
  readonly streams = new Map<string, EventListener>();

  dispatch = (event: AgentEvent): void => {
    this.streams.get(event.runId)?.(event);
    for (const listener of this.listeners) {
      try {
        // An async function is a listener too: its rejection is its own, like a throw, and
        // must not reach the process as an unhandled rejection (which ends a Node service).
        const returned: unknown = listener(event);
        if (isThenable(returned)) Promise.resolve(returned).catch(() => undefined);
      } catch {
        // A throwing listener must not break the run or other listeners.
      }
    }
  };

  /** Whether an event of `runId` would reach anyone (the core skips building the rest). */
  isObserved = (runId: string): boolean => this.listeners.size > 0 || this.streams.has(runId);
}

/**
 * An agent: a model, tools and instructions; remembers each session's conversation. `Output`
 * is what a completed run's `output` is: the text without `returns`, what a
 * Standard Schema `returns` parses to, `unknown` for a JSON Schema `returns` (name it with
 * `run<T>()`).
 */
export class Agent<Output = unknown> {
  readonly #core: CoreAgentHandle;
  readonly #signals: Map<string, AbortSignal>;
  /** Aborted by `close()` once the core is freed: every direct operation's signal follows it. */
  readonly #directStop = sharedController();
  readonly #hub: EventHub;
  /** Lets go of the core and of what ties it to the world outside the agent (see {@link attach}). */
  readonly #release: (flushTimeoutMs?: number) => Promise<void>;
  /** A Standard Schema `returns`'s parse of each run's answer (see `RunSupport`). */
  readonly #parsedOutputs: Map<string, unknown> | undefined;
  /** The last error a provider threw in each run, to hand on as the run's failure's `cause`. */
  readonly #providerFailures: Map<string, unknown>;
  #closed = false;
  #closing: Promise<void> | undefined;
  /** Read once: the core it comes from is freed by `close()`. */
  readonly #emergentEnabled: boolean;
  /** Runs this agent is driving: `close()` aborts them and waits for them to end. */
  readonly #runs = new Map<string, { controller: AbortController; done: Promise<unknown>; lastEventOut?: boolean }>();

  /** Forged tools (the emergent registry). */
  readonly tools: {
    /** Calls a forged tool as `sessionId` sees it. Output is checked against its schema.
     *  Arguments the schema refuses, or that cannot be read as JSON (a `BigInt`, a cycle, a
     *  value nested past `JSON.stringify`'s depth), reject with `invalid_arguments`. A call
     *  made while `emergent.maxCallsWaiting` (1024 by default) calls of this agent wait already
     *  (on host tools or forged code) rejects with `too_many_calls`: most often a host tool
     *  calling back, after an `await`, a forged tool that reaches it again. */
    call(name: string, args: unknown, options?: CallOptions): Promise<unknown>;
    /** The forged tools a session sees: name, tier, version, hash, stats. */
    list(options?: SessionOptions): ToolInfo[];
  };

  /** Registry management: stats, promotion, approvals, demotion, rollback, export/import. */
  readonly emergent: {
    /** The forge counters: attempts (imports included), approvals, rejections by category,
     *  unique names. Kept in the store across restarts. */
    stats(): ForgeStats;
    /** Moves `name` up one tier: `agent` from the session's tier (its tests re-run, then a
     *  two-reviewer panel), or `shared` from the agent tier, which waits for {@link approve}
     *  (`status: 'pending'`, with the approval to show a person). A panel reviewer that gives
     *  no verdict within its judge's `timeoutMs` rejects the promotion (`status: 'rejected'`,
     *  the reason says so). Rejects with `AbortError` when `options.signal` aborts it. */
    requestPromotion(name: string, tier: Tier, options?: PromotionOptions): Promise<PromotionOutcome>;
    /** A person grants a pending shared promotion: the version they were shown moves to the
     *  shared tier. A request whose version left the agent tier (demoted, rolled back, another
     *  version promoted there) is withdrawn when that happens: it leaves `pendingApprovals()`, a
     *  `promotion.rejected` event names it, and approving it fails `no_such_approval`. */
    approve(approvalId: string): Promise<ToolInfo>;
    /** A person refuses a pending shared promotion; `reason` (a string, default `"denied"`) goes
     *  into the audit trail. */
    deny(approvalId: string, reason?: string): Promise<void>;
    /** Moves the highest active tool of that name down one tier; the old tier keeps a
     *  tombstone that cannot be called (`lowest_tier` for a session tool). An agent-tier tool
     *  lands in the session `options.sessionId` names (`default` without one), not the one that
     *  forged it: other sessions, that one included, can no longer call it. A forged tool stored
     *  under one of the agent's own tools' names, which nothing reaches, is refused with
     *  `tool_not_found`. */
    demote(name: string, options?: SessionOptions): Promise<ToolInfo>;
    /** Makes `version` the tool's current version again (above the session tier, only a
     *  version that passed that tier's review: else `unreviewed_version`; a compose version
     *  that would call itself through the tools it calls now is refused: `pipeline_cycle`; one
     *  stored under one of the agent's own tools' names, `tool_not_found`). */
    rollback(name: string, version: number, options?: SessionOptions): Promise<ToolInfo>;
    /** The tool as a portable `crucible.tool.v1` YAML package (sandbox source redacted unless
     *  `persistSandboxSource`). A forged tool stored under one of the agent's own tools' names,
     *  which nothing reaches, is refused with `tool_not_found`. */
    export(name: string, options?: SessionOptions): Promise<string>;
    /** Imports a `crucible.tool.v1` or `agentos.emergent-tool.v1` package into the session tier,
     *  re-running its tests and the judge. agentos packages carry no test cases: pass them as
     *  `testCases` (a package without any is refused, and one with its own refuses them). A
     *  package identical (content hash) to the tool the session is offered under its name
     *  answers with that tool, `unchanged: true`: no new version, tests or judge call. */
    import(pkg: string, options?: ImportOptions): Promise<ForgeResult>;
    /** Shared promotions waiting for a person's {@link approve} or {@link deny}. */
    pendingApprovals(): PendingApproval[];
    /** The provenance trail (forges, verdicts, promotions, demotions, imports), oldest first,
     *  bounded (the latest `emergent.auditCapacity`, 500 by default). */
    audit(): AuditEntry[];
    /** Writes buffered tool stats to the store now (they are also written every
     *  `emergent.statsFlushEvery` calls, 16 by default, at `endSession`, at `close()` and when a
     *  page is left: `beforeunload`, `pagehide`). */
    flushStats(): Promise<void>;
    /** Resolves once no automatic promotion is in flight. The call that brings a session tool
     *  to `promotionThreshold.uses` returns its result at once, and its promotion (tests re-run,
     *  two-reviewer panel, up to twice the judge's `timeoutMs`) goes on in the background,
     *  told by `tool.promoted` / `promotion.rejected` events to {@link Agent.on} listeners (it
     *  belongs to no run: the run that made the call may end first without stopping it).
     *  {@link Agent.close} aborts it (nothing is recorded) and waits for it. Not to be awaited
     *  inside a host tool that a compose tool under review calls: the review re-runs its tests,
     *  which call that tool, which would wait for the review (until `close()`). */
    settled(): Promise<void>;
  };

  /** @internal use {@link createAgent} */
  constructor(
    core: CoreAgentHandle,
    signals: Map<string, AbortSignal>,
    hub: EventHub,
    sandbox?: SandboxHost,
    store?: Store,
    releaseRegistry?: () => void,
    runSupport: RunSupport = { providerFailures: new Map() },
    background?: AbortController,
  ) {
    this.#core = core;
    this.#parsedOutputs = runSupport.parsedOutputs;
    this.#providerFailures = runSupport.providerFailures;
    const waitingCalls = new Set<(error: CrucibleError) => void>();
    const maxCallsWaiting = runSupport.maxCallsWaiting ?? DEFAULT_MAX_CALLS_WAITING;
    const { channel, release, letGo } = attach(core, store, sandbox, releaseRegistry, background, this.#directStop, waitingCalls);
    this.#release = release;
    unclosedAgents.register(this, letGo, this);
    this.#signals = signals;
    this.#emergentEnabled = core.emergentEnabled;
    this.#hub = hub;
    const session = (o: SessionOptions | undefined, what: string) => sessionOf(readOptions(o, what, ['sessionId']).sessionId);
    const wrap = <T>(f: () => T): T => {
      try {
        return f();
      } catch (error) {
        throw toCrucibleError(error, '');
      }
    };
    // After a change that may touch the shared tier, the other agents of the runtime re-read it.
    const shared = async <T>(result: T): Promise<T> => {
      await reloadSharedTier(store, core);
      announceSharedTierChange(channel, store?.broadcastName);
      return result;
    };
    // Every entry point checks first that the agent is open: a closed agent's core is freed,
    // and the binding would fail with an untyped "null pointer passed to rust".
    const whileOpen = <T>(what: string, f: () => T): T => {
      this.#assertOpen(what);
      return f();
    };
    const toolName = (name: unknown, what: string) => requireString(name, `${what}: the tool name`);
    this.tools = {
      call: (name, args, o) => {
        let call: string | Promise<unknown>;
        let signal: AbortSignal | undefined;
        try {
          this.#assertOpen('tools.call');
          const options = readOptions(o, 'tools.call', ['sessionId', 'signal']);
          const [tool, sessionId] = [toolName(name, 'tools.call'), sessionOf(options.sessionId)];
          signal = abortSignal(options.signal, 'tools.call');
          const json = argumentsJson(args);
          refuseTooManyWaiting(waitingCalls, maxCallsWaiting);
          call = signal
            ? this.#direct(signal, async (s, runId) => valueOf(core.callTool(tool, json, sessionId, s, runId)))
            : core.callTool(tool, json, sessionId, undefined, undefined);
          // Finished at once (a pipeline of synchronous host tools): no reaction to wait for.
          if (typeof call === 'string') return Promise.resolve(JSON.parse(call));
        } catch (error) {
          return Promise.reject(toCrucibleError(error, ''));
        }
        // One reaction types the failure, where two async wrappers' promises and queue turns
        // were 3-5% of a compose call. It holds the agent, as `#direct` does: reachable while
        // the call is in flight. `close()` rejects it through `waitingCalls` (a host tool it
        // reached may never answer), in the same queue turn as before when it settles first.
        const [pending, given] = [call, signal];
        return new Promise((resolve, reject) => {
          waitingCalls.add(reject);
          pending.then(
            (value) => {
              waitingCalls.delete(reject);
              resolve(value);
            },
            (error: unknown) => {
              waitingCalls.delete(reject);
              reject(this.#callFailure(error, given));
            },
          );
        });
      },
      list: (o) => wrap(() => whileOpen('tools.list', () => core.listTools(session(o, 'tools.list')))),
    };
    this.emergent = {
      stats: () => wrap(() => whileOpen('emergent.stats', () => core.forgeStats())),
      requestPromotion: (name, tier, o) =>
        wrapAsync(() =>
          whileOpen('requestPromotion', () => {
            const { sessionId, signal } = readOptions(o, 'requestPromotion', ['sessionId', 'signal']);
            const [tool, to, session] = [toolName(name, 'requestPromotion'), requireString(tier, 'requestPromotion: the tier'), sessionOf(sessionId)];
            return this.#direct(abortSignal(signal, 'requestPromotion'), (abort, runId) => core.requestPromotion(tool, to, session, abort, runId));
          }),
        ),
      approve: (id) => wrapAsync(() => whileOpen('approve', () => core.approve(requireString(id, 'an approval id')).then(shared))),
      deny: (id, reason = 'denied') => wrapAsync(() => whileOpen('deny', () => core.deny(requireString(id, 'an approval id'), requireString(reason, 'deny: the reason')))),
      demote: (name, o) => wrapAsync(() => whileOpen('demote', () => core.demote(toolName(name, 'demote'), session(o, 'demote')).then(shared))),
      rollback: (name, version, o) =>
        wrapAsync(() =>
          whileOpen('rollback', () => {
            // The binding would turn 1.5 into version 1 without a word, and 2 ** 32 + 1 too
            // (it passes a version modulo 2 ** 32): no version has a number past MAX_U32.
            if (!Number.isInteger(version) || version < 1 || version > MAX_U32) {
              // describeValue: `String()` throws on an object without a prototype, and that
              // TypeError would replace this error.
              throw new CrucibleError('invalid_argument', `rollback: version must be a positive integer up to ${MAX_U32}, got ${describeValue(version)}`);
            }
            return core.rollback(toolName(name, 'rollback'), version, session(o, 'rollback')).then(shared);
          }),
        ),
      export: (name, o) => wrapAsync(async () => whileOpen('export', () => core.exportTool(toolName(name, 'export'), session(o, 'export')))),
      import: (pkg, o) =>
        wrapAsync(() =>
          whileOpen('import', () => {
            const options = readOptions(o, 'import', ['sessionId', 'testCases', 'signal']);
            const [text, session, testCases] = [requireString(pkg, 'import: the package'), sessionOf(options.sessionId), importTestCases(options.testCases)];
            return this.#direct(abortSignal(options.signal, 'import'), (abort, runId) => core.importTool(text, session, { testCases }, abort, runId));
          }),
        ),
      pendingApprovals: () => wrap(() => whileOpen('pendingApprovals', () => core.pendingApprovals())),
      audit: () => wrap(() => whileOpen('audit', () => core.audit())),
      flushStats: () => wrapAsync(() => whileOpen('flushStats', () => core.flushStats())),
      settled: () => wrapAsync(() => whileOpen('emergent.settled', () => core.settled())),
    };
  }

  /** Whether `forge_tool` and the registry are enabled. */
  get emergentEnabled(): boolean {
    return this.#emergentEnabled;
  }

  /**
   * Listens to every event of this agent: runs, and registry events outside runs (forges
   * through {@link Agent.forge}, promotions, approvals). Returns the unsubscribe function.
   * A listener that throws, or returns a promise that rejects, is not heard from: the run and
   * the other listeners go on.
   */
  on(listener: (event: AgentEvent) => void): () => void {
    this.#hub.listeners.add(listener);
    return () => this.#hub.listeners.delete(listener);
  }

  /**
   * Forges a tool: normalize → shape check → build → test → judge → register. Resolves with
   * `{ success: true, tool, verdict, tests }` or `{ success: false, reason, category }`; never
   * throws for a bad request (one with no JSON form, such as a circular object, included).
   * A request identical to the active tool the session reaches under that name resolves with
   * that tool as it is (`unchanged: true`, `tests` empty): no new version, no tests, no judge call.
   * `usage`: the judge's tokens, whenever it was asked (a forge outside a run is in no run's usage).
   * Of two different forges or imports of one name in a session at once, the one registered
   * first stands and the other is rejected (`other`, its reason naming the version there).
   * Rejects with `AbortError` when `options.signal` aborts it, and with the `closed` error
   * when the agent is closed before its tests and judge are done.
   */
  forge(request: ForgeRequest | Record<string, unknown>, options: ForgeOptions = {}): Promise<ForgeResult> {
    return wrapAsync(async () => {
      this.#assertOpen('forge');
      const { sessionId, scope, signal } = readOptions(options, 'forge', ['sessionId', 'scope', 'signal']);
      const label = scope === undefined ? undefined : requireString(scope, 'forge: scope');
      return this.#direct(abortSignal(signal, 'forge'), (abort, runId) => this.#core.forge(request, sessionOf(sessionId), label, abort, runId));
    });
  }

  /** The typed failure of a direct `tools.call` (`signal`: the caller's). `close()` stops the
   *  sandbox under a forged tool's call in flight, and aborts a call given a signal: that call
   *  failed because the agent closed, as a forge cut off then does (`closed`), not because the
   *  sandbox could not run it (`sandbox_unavailable`, which invites a retry) or its caller
   *  stopped it (`aborted`). */
  #callFailure(error: unknown, signal?: AbortSignal): CrucibleError {
    const failure = toCrucibleError(error, '');
    const cutOff = failure.code === 'sandbox_unavailable' || (failure.code === 'aborted' && signal?.aborted === false);
    return this.#closed && cutOff ? closedWhileCalling(failure) : failure;
  }

  /** Throws the typed `closed` error once {@link Agent.close} has begun. */
  #assertOpen(what: string): void {
    if (this.#closed) throw new CrucibleError('closed', `${what}: the agent is closed; create a new one`);
  }

  /**
   * Starts an operation outside any run (a forge, a tool call) that `signal` aborts, and so does
   * `close()`. Its model and host tool calls find their signal by run id, so with a signal it
   * gets an id of its own (`direct_…`) for the time it runs; its events still carry none (it is
   * in no run). Without one it gets no id: its judge's request and host tool calls get no
   * signal, as before (a host tool given one takes a slower path, ~30 µs a forge), and `close()`
   * ends it through the core, which drops the judge's stream and so aborts its request.
   */
  async #direct<T>(signal: AbortSignal | undefined, start: (signal: AbortSignal | undefined, runId: string) => Promise<T>): Promise<T> {
    const closing = this.#directStop.signal;
    const runId = signal ? `direct_${newRunId().slice('run_'.length)}` : '';
    const linked = signal ? linkSignals(signal, closing) : undefined;
    if (linked) this.#signals.set(runId, linked.signal);
    // Awaited here, and `this` used after it: while a forge or call is in flight its agent
    // stays reachable, so the finalizer of an agent dropped without close() cannot let go of
    // its sandbox and registry under it.
    try {
      return await start(linked?.signal ?? closing, runId);
    } finally {
      linked?.unlink();
      this.#signals.delete(runId);
    }
  }

  /**
   * Runs `input` and yields every event as it happens. The last event is `agent.end`,
   * `agent.paused` or `agent.error`. Breaking out of the loop aborts the run. `text.delta` events the consumer
   * has not read yet are merged into one (same text, fewer events), so a slow consumer holds
   * about the text, not an event per chunk. An `input` longer than 16 Mi characters (some 4M
   * tokens, past every model's context) is refused with `invalid_argument` before the core
   * copies it.
   */
  stream(input: string, options: RunOptions = {}): AsyncGenerator<AgentEvent, void, undefined> {
    if (typeof input !== 'string') return failing(new CrucibleError('invalid_config', `agent.run/stream: input must be a string, got ${describeType(input)}`));
    // Like a tool's arguments or result: the core's memory never shrinks, and far past this a
    // JSON text the core builds from the input outgrows the longest string JS can make, which
    // would throw from inside the core instead of failing the run.
    if (input.length > MAX_UNITS_INTO_CORE) {
      return failing(new CrucibleError('invalid_argument', `agent.run/stream: input is ${input.length} characters; at most ${MAX_UNITS_INTO_CORE} are read`));
    }
    if (options === null || typeof options !== 'object') return failing(new CrucibleError('invalid_config', 'agent.run/stream: options must be an object'));
    // Read once: a getter could answer differently the second time.
    let signal: AbortSignal | undefined;
    let sessionId: string | undefined;
    let scope: string | undefined;
    try {
      const unknownRunOption = unknownOptionsError(options, RUN_OPTION_NAMES, 'agent.run/stream');
      if (unknownRunOption) return failing(unknownRunOption);
      ({ signal, sessionId, scope } = options);
    } catch (error) {
      return failing(unreadableOptions(error, 'agent.run/stream'));
    }
    for (const [value, what] of [[sessionId, 'sessionId'], [scope, 'scope']] as const) {
      if (value !== undefined && typeof value !== 'string') return failing(notString(value, `agent.run/stream: ${what}`, 'invalid_config'));
    }
    const wrongSignal = readSignal(signal, 'agent.run/stream');
    if (wrongSignal) return failing(wrongSignal);
    return this.#drive(newRunId(), signal, (runId, onEvent, runSignal) => this.#core.run(input, runId, sessionId, scope, onEvent, runSignal));
  }

  /**
   * Continues a paused run (or one interrupted between steps) and yields its events. `run`
   * is the run id (its state is loaded from the agent's store) or the paused
   * {@link RunResult} itself (`{ runId, state }`: without a store, its state is what runs; a
   * state of another run than `runId` is refused with `invalid_resume`).
   */
  resumeStream(run: string | { runId: string; state?: unknown }, options: ResumeOptions = {}): AsyncGenerator<AgentEvent, void, undefined> {
    if (options === null || typeof options !== 'object') return failing(new CrucibleError('invalid_config', 'agent.resume: options must be an object'));
    let runId: unknown;
    let state: unknown;
    let signal: AbortSignal | undefined;
    let approvals: ApprovalDecision[] | undefined;
    try {
      [runId, state] = typeof run === 'string' ? [run, undefined] : run !== null && typeof run === 'object' ? [run.runId, run.state] : [undefined, undefined];
      const unknownResumeOption = unknownOptionsError(options, RESUME_OPTION_NAMES, 'agent.resume');
      if (unknownResumeOption) return failing(unknownResumeOption);
      ({ signal, approvals } = options);
    } catch (error) {
      return failing(unreadableOptions(error, 'agent.resume'));
    }
    if (typeof runId !== 'string') {
      return failing(new CrucibleError('invalid_config', 'agent.resume: pass a run id or the paused RunResult ({ runId, state })'));
    }
    const wrongSignal = readSignal(signal, 'agent.resume');
    if (wrongSignal) return failing(wrongSignal);
    let decisions: ApprovalDecision[] | undefined;
    try {
      decisions = checkedApprovals(approvals);
    } catch (error) {
      return failing(unreadableOptions(error, 'agent.resume'));
    }
    return this.#drive(runId, signal, (id, onEvent, runSignal) => this.#core.resume(id, state, decisions, onEvent, runSignal));
  }

  /** {@link Agent.resumeStream}, collected like {@link Agent.run}. */
  resume<O = Output>(run: string | { runId: string; state?: unknown }, options: ResumeOptions = {}): Promise<RunResult<O>> {
    return collect<O>(this.resumeStream(run, options), signalOf(options));
  }

  /**
   * The run's events ({@link Agent.#events}), whose `return()` and `throw()` abort the run at
   * once. An async generator queues them behind a `next()` still waiting, so a consumer giving
   * up on a stalled stream (a per-event timeout racing `next()`, then `return()`) would wait
   * for the model's next chunk, or its provider's timeout, before the run was aborted.
   */
  #drive(
    runId: string,
    outerSignal: AbortSignal | undefined,
    start: (runId: string, onEvent: EventListener, signal: AbortSignal) => Promise<unknown>,
  ): AsyncGenerator<AgentEvent, void, undefined> {
    const stop: { early?: () => void } = {};
    const events = this.#events(runId, outerSignal, start, stop);
    const [giveUp, fail] = [events.return.bind(events), events.throw.bind(events)];
    events.return = (value) => {
      stop.early?.();
      return giveUp(value);
    };
    events.throw = (error) => {
      stop.early?.();
      return fail(error);
    };
    return events;
  }

  async *#events(
    runId: string,
    outerSignal: AbortSignal | undefined,
    start: (runId: string, onEvent: EventListener, signal: AbortSignal) => Promise<unknown>,
    stop: { early?: () => void },
  ): AsyncGenerator<AgentEvent, void, undefined> {
    // A generator's body runs at its first `next()`: a stream made before `close()` and read
    // after it must not reach the freed core.
    this.#assertOpen('agent.run/stream');
    // A run whose last event is out is only letting go of it: a listener resuming it on
    // hearing `agent.paused` waits for that, rather than being told it is still running.
    const ending = this.#runs.get(runId);
    if (ending?.lastEventOut) await ending.done;
    // One stream per run: a second resume of a run still going would take over its event
    // stream and abort signal (the core refuses it too, but only after this point).
    if (this.#hub.streams.has(runId)) {
      throw new CrucibleError('invalid_resume', `run ${runId} is already running in this agent`);
    }
    const options = { signal: outerSignal };
    const controller = new AbortController();
    const onOuterAbort = () => controller.abort(options.signal?.reason);
    if (options.signal?.aborted) controller.abort(options.signal.reason);
    options.signal?.addEventListener('abort', onOuterAbort, { once: true });

    const queue: AgentEvent[] = [];
    let head = 0;
    let wake: (() => void) | undefined;
    let finished = false;
    let failure: unknown;
    let reportedError = false;
    this.#signals.set(runId, controller.signal);
    const push = (event: AgentEvent) => {
      if (event.type === 'agent.error') reportedError = true;
      if (event.type === 'agent.error' || event.type === 'agent.paused' || event.type === 'agent.end') {
        const running = this.#runs.get(runId);
        if (running) running.lastEventOut = true;
      }
      // What travels beside the run's last event is tied to it now, as the core emits it: the
      // run's entries in these maps go when the run settles, which can be before the consumer
      // reads this event.
      if (event.type === 'agent.error' && event.error.code.startsWith('provider_') && this.#providerFailures.has(runId)) {
        besideEvents.set(event, this.#providerFailures.get(runId));
      }
      if (event.type === 'agent.end' && this.#parsedOutputs?.has(runId)) {
        besideEvents.set(event, this.#parsedOutputs.get(runId));
        this.#parsedOutputs.delete(runId);
      }
      // A consumer that is behind gets the text it has not read yet as one delta, not one event
      // per chunk (~200 bytes each): what waits is then about the size of the text.
      const last = queue.length > head ? queue[queue.length - 1] : undefined;
      if (event.type === 'text.delta' && last?.type === 'text.delta' && last.step === event.step) {
        queue[queue.length - 1] = { ...last, delta: last.delta + event.delta };
        return;
      }
      queue.push(event);
      wake?.();
    };
    // Registry events of this run (forge stages) arrive through the hub.
    this.#hub.streams.set(runId, push);
    // A start that throws at once fails the stream like one that rejects: the run's entries
    // in the hub and the signal map are removed when it settles either way.
    const begin = (): Promise<unknown> => {
      try {
        return start(runId, this.#hub.dispatch, controller.signal);
      } catch (error) {
        return Promise.reject(error);
      }
    };
    const done = begin()
      // Run-level failures arrive as an `agent.error` event; only unexpected core failures land here.
      .catch((error: unknown) => {
        if (!reportedError) failure = error;
      })
      // The run's entries go when it ends, not when the stream is closed: a consumer may drop
      // the stream mid-read without closing it, and they would stay for good.
      .finally(() => {
        finished = true;
        this.#runs.delete(runId);
        this.#hub.streams.delete(runId);
        this.#signals.delete(runId);
        this.#providerFailures.delete(runId);
        this.#parsedOutputs?.delete(runId);
        options.signal?.removeEventListener('abort', onOuterAbort);
        wake?.();
      });
    this.#runs.set(runId, { controller, done });
    stop.early = () => {
      if (!finished) controller.abort(new AbortError('The stream consumer stopped early'));
    };
    try {
      for (;;) {
        if (head < queue.length) {
          const event = queue[head++]!;
          if (head > 1024) {
            queue.splice(0, head);
            head = 0;
          }
          yield event;
          continue;
        }
        if (finished) break;
        await new Promise<void>((resolve) => (wake = resolve));
        wake = undefined;
      }
      if (failure !== undefined) throw toCrucibleError(failure, runId);
    } finally {
      stop.early();
      await done;
    }
  }

  /**
   * Runs `input` to a final answer. Rejects with {@link AgentRunError} (limits, model errors,
   * invalid structured output) or {@link AbortError}.
   */
  run<O = Output>(input: string, options: RunOptions = {}): Promise<RunResult<O>> {
    return collect<O>(this.stream(input, options), signalOf(options));
  }

  /** The conversation of a session so far: what is kept of it within `sessionHistory`, and
   *  what its next run sends the model. */
  history(sessionId = 'default'): unknown[] {
    this.#assertOpen('history');
    return this.#core.history(requireString(sessionId, 'history: sessionId')) as unknown[];
  }

  /** Forgets a session's conversation and discards its session-tier tools. */
  async endSession(sessionId = 'default'): Promise<void> {
    this.#assertOpen('endSession');
    await wrapAsync(() => this.#core.endSession(requireString(sessionId, 'endSession: sessionId')));
  }

  /**
   * The runs whose state this agent's store holds: paused ones (with their `pendingApprovals`)
   * and ones interrupted between steps (a model error, an abort, a process that ended), and
   * as `running` those a run or resume is driving in this page, worker or process, or in
   * another tab or worker when the store has `tryLock` (a run holds its lock while it goes;
   * `indexedDbStore` with Web Locks). Without `tryLock`, one driven elsewhere shows its saved
   * status, and resuming it waits for that run. An aborted run is `interrupted`: the store does
   * not record why a run stopped, so pass the `AbortError`'s `runId` to
   * {@link Agent.discardRun} when the abort means "stop for good". Each can be resumed with
   * {@link Agent.resume} or dropped with {@link Agent.discardRun}; nothing else removes them.
   * Empty without a store.
   */
  storedRuns(): Promise<StoredRun[]> {
    return wrapAsync(async () => {
      this.#assertOpen('storedRuns');
      return this.#core.storedRuns();
    });
  }

  /**
   * Deletes the stored state of a run that will not be resumed; resolves `true` when there was
   * one. A run that is running or being resumed in this agent is refused (`invalid_resume`); a
   * resume in another tab or process is waited for.
   */
  async discardRun(runId: string): Promise<boolean> {
    this.#assertOpen('discardRun');
    requireString(runId, 'discardRun: the run id');
    if (this.#hub.streams.has(runId)) throw new AgentRunError('invalid_resume', `run ${runId} is running in this agent`, runId);
    return wrapAsync(() => this.#core.discardRun(runId), runId);
  }

  /** Names of the agent's own (host) tools. Forged tools and `forge_tool`, which the model is
   *  offered too, are listed by `tools.list()`. */
  toolNames(): string[] {
    this.#assertOpen('toolNames');
    return this.#core.toolNames();
  }

  /**
   * Aborts the runs still going (they end with `AbortError`) and waits for them (a resumed
   * step's human-approved calls are not abandoned: a host tool among them that ignores its
   * signal holds `close()` until it returns), stops the automatic promotions under review
   * (nothing is recorded; one whose panel approved commits) and waits for them, writes
   * buffered stats, releases the wasm agent, stops the sandbox this agent created. A forge,
   * import or `requestPromotion` made outside a run, and a tool call given a signal, are then
   * stopped (their judge's request and host tool calls see their signal abort) and reject with
   * the `closed` error, as does a call whose forged code was running in the sandbox, and a tool
   * call made without a signal (a host tool it reached gets no signal: what it returns later
   * is dropped).
   * Afterwards every method fails with the `closed` error; closing again does nothing.
   * Rejects with the store's `StoreError` when the buffered stats could not be written: the
   * agent is closed all the same, and those calls are not counted in the store (call
   * `agent.emergent.flushStats()` first to retry a failed write), or that did not answer
   * within `options.flushTimeoutMs`.
   */
  close(options?: CloseOptions): Promise<void> {
    // A second close() waits for the first (its caller may open the same agent id next); a
    // failed final write is told to the first caller only.
    if (this.#closing) return this.#closing.catch(() => undefined);
    let flushTimeoutMs: unknown;
    try {
      flushTimeoutMs = options?.flushTimeoutMs ?? DEFAULT_CLOSE_FLUSH_TIMEOUT_MS;
    } catch (error) {
      return Promise.reject(unreadableOptions(error, 'close', 'invalid_argument'));
    }
    if (!(typeof flushTimeoutMs === 'number' && flushTimeoutMs >= 0 && Number.isFinite(flushTimeoutMs))) {
      return Promise.reject(new CrucibleError('invalid_argument', `close: flushTimeoutMs must be a finite number of ms ≥ 0, got ${describeValue(flushTimeoutMs)}`));
    }
    this.#closing = this.#close(flushTimeoutMs);
    return this.#closing;
  }

  async #close(flushTimeoutMs: number): Promise<void> {
    this.#closed = true;
    const runs = [...this.#runs.values()];
    for (const run of runs) run.controller.abort(new AbortError('the agent was closed'));
    // A run's `done` settles, never rejects.
    await Promise.all(runs.map((run) => run.done));
    unclosedAgents.unregister(this);
    await wrapAsync(() => this.#release(flushTimeoutMs));
  }
}

/** An event stream that fails with `error` when first read (bad arguments reject like any
 *  other failure of a run instead of throwing where the call was made). */
// eslint-disable-next-line require-yield
async function* failing(error: CrucibleError): AsyncGenerator<AgentEvent, void, undefined> {
  throw error;
}

/** Numbers for store objects, so the core knows which agents share one (it keeps some turns
 *  per store); a store that is gone is forgotten with it. */
const storeIds = new WeakMap<object, number>();
let nextStoreId = 1;
function storeIdOf(store: object): number {
  let id = storeIds.get(store);
  if (id === undefined) storeIds.set(store, (id = nextStoreId++));
  return id;
}

/**
 * A string argument as the core takes it; anything else is a typed error here. The binding
 * does not check: a number where it expects a string reads wasm memory out of bounds.
 */
function requireString(value: unknown, what: string): string {
  if (typeof value !== 'string') throw notString(value, what);
  return value;
}

/** The error for `value` where a string was needed. */
function notString(value: unknown, what: string, code: 'invalid_argument' | 'invalid_config' = 'invalid_argument'): CrucibleError {
  return new CrucibleError(code, `${what} must be a string, got ${describeType(value)}`);
}

/**
 * `resume`'s approvals, checked and copied field by field (each read once): the core's
 * refusal of a misshapen one names a position in JSON text the caller never wrote. `null`
 * is none, as an absent option.
 */
function checkedApprovals(approvals: unknown): ApprovalDecision[] | undefined {
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
function importTestCases(testCases: unknown): ForgeTestCase[] | undefined {
  if (testCases === undefined || testCases === null) return undefined;
  if (!Array.isArray(testCases)) throw new CrucibleError('invalid_argument', `import: testCases must be an array of test cases, got ${describeValue(testCases)}`);
  // The cases themselves are read as a forge request's are, however messy.
  return testCases as ForgeTestCase[];
}

/** The session an option names (`"default"` when it names none). */
function sessionOf(sessionId: unknown): string {
  return sessionId === undefined ? 'default' : requireString(sessionId, 'sessionId');
}


/** What an agent needs of `createAgent` to finish its runs' results. */
interface RunSupport {
  /** With a Standard Schema `returns`: each run's answer as the schema parsed it, by run id
   *  (filled by the core's output check, taken by `run()`). */
  parsedOutputs?: Map<string, unknown>;
  /** Filled by the model adapter: the last error a provider threw, by run id. */
  providerFailures: Map<string, unknown>;
  /** `emergent.maxCallsWaiting`, as `createAgent` read it. */
  maxCallsWaiting?: number;
}

/** What travels beside a run's last event, which is plain JSON data: for an `agent.error`, the
 *  provider's own error (`collect` hands it on as `cause`); for an `agent.end`, the answer as a
 *  Standard Schema `returns` parsed it. */
const besideEvents = new WeakMap<AgentEvent, unknown>();

/**
 * The result of a run from its events. With a Standard Schema `returns`, `output` is the answer
 * as the schema parsed it when the core checked it (see `checkOutput` in `createAgent`; it
 * travels beside `agent.end`): its defaults and transforms, which events, being plain JSON, do
 * not carry.
 */
/** The run's result from its events; an abort rejects with the signal's reason as its `cause`
 *  (a `TimeoutError` from `AbortSignal.timeout`, or what the caller passed to `abort()`), so a
 *  deadline can be told from a user's stop. */
async function collect<Output>(events: AsyncIterable<AgentEvent>, signal?: AbortSignal): Promise<RunResult<Output>> {
  for await (const event of events) {
    switch (event.type) {
      case 'agent.end':
        return {
          runId: event.runId,
          status: 'completed',
          pendingApprovals: [],
          output: (besideEvents.has(event) ? besideEvents.get(event) : event.output) as Output,
          text: event.text,
          usage: event.usage,
          turns: event.turns,
          steps: event.steps,
          finishReason: event.finishReason,
        };
      case 'agent.paused': {
        const state = event.state as { turns?: number; steps?: number };
        return {
          runId: event.runId,
          status: 'paused',
          pendingApprovals: event.approvals,
          state: event.state,
          output: undefined,
          text: '',
          usage: event.usage,
          turns: state.turns ?? 0,
          steps: state.steps ?? 0,
          finishReason: 'tool_calls',
        };
      }
      case 'agent.error':
        if (event.error.code === 'aborted') {
          throw new AbortError(event.error.message, { runId: event.runId, usage: event.usage, cause: signal?.aborted ? signal.reason : undefined });
        }
        throw new AgentRunError(event.error.code, event.error.message, event.runId, event.usage, event.error.status, besideEvents.get(event));
      default:
        break;
    }
  }
  throw new CrucibleError('internal', 'the run ended without a final event');
}

/** `f()`, its failure (thrown or rejected) as a typed error. */
async function wrapAsync<T>(f: () => Promise<T>, runId = ''): Promise<T> {
  try {
    return await f();
  } catch (error) {
    throw toCrucibleError(error, runId);
  }
}

function toCrucibleError(error: unknown, runId: string): CrucibleError {
  if (error instanceof CrucibleError) return error;
  const e = error as { code?: string; message?: string };
  if (e?.code === 'aborted') return new AbortError(e.message, { runId: runId || undefined });
  // A store failure outside a run is a StoreError (a registry write, a run's claim). A run that
  // fails on its store ends with an AgentRunError of the store's code (see `collect`), which
  // names the run to resume.
  if (typeof e?.code === 'string' && e.code.startsWith('store_')) {
    return new StoreError(e.code as Extract<CrucibleErrorCode, `store_${string}`>, e.message ?? String(error));
  }
  return new AgentRunError((e?.code as CrucibleErrorCode) ?? 'internal', e?.message ?? String(error), runId);
}

/**
 * The host tools of `createAgent`'s `tools` option, by name, and their specs as the core takes
 * them. A tool whose fields throw when read (a getter, a Proxy) is the caller's
 * `invalid_config`, with what it threw as the `cause`.
 */
function hostToolsOf(given: readonly HostTool[] | undefined): { byName: Map<string, HostTool>; specs: unknown[] } {
  return readingOption('tools', () => {
    // Array.from: a hole of a sparse array is an element too (some() and map() skip holes).
    const tools = Array.isArray(given) ? Array.from(given) : (given ?? []);
    if (!Array.isArray(tools) || tools.some((t) => t === null || typeof t !== 'object')) {
      throw new CrucibleError('invalid_config', 'createAgent: `tools` must be an array of tools made with tool({...})');
    }
    for (const t of tools) {
      // Tools not made with tool() are checked here too.
      if (isRecord(t.inputSchema)) refuseNonObjectArguments(t.inputSchema, `tool ${JSON.stringify(t.name)}`);
      if (!isApprovalRule(t.needsApproval)) {
        throw new CrucibleError('invalid_config', `tool ${t.name}: needsApproval must be true, false or a function of the arguments, got ${describeType(t.needsApproval)}`);
      }
    }
    const specs = tools.map((t) => ({
      name: t.name,
      description: t.description,
      inputSchema: t.inputSchema,
      outputSchema: t.outputSchema,
      needsApproval: typeof t.needsApproval === 'function' ? 'predicate' : t.needsApproval === true,
    }));
    return { byName: new Map(tools.map((t) => [t.name, t])), specs };
  });
}

/** Creates an agent. Rejects with a `CrucibleError` (`invalid_config`) on bad options, and on
 *  options that throw when read (a getter, a Proxy trap): its message names the option, its
 *  `cause` is what was thrown. */
export async function createAgent<S extends StandardJsonSchemaLike>(options: AgentOptions & { returns: S }): Promise<Agent<InferSchemaOutput<S>>>;
export async function createAgent(options: AgentOptions & { returns: JsonSchema }): Promise<Agent<unknown>>;
export async function createAgent(options: AgentOptions & { returns?: undefined }): Promise<Agent<string>>;
export async function createAgent(options: AgentOptions): Promise<Agent>;
export async function createAgent(given: AgentOptions): Promise<Agent> {
  const options = readAgentOptions(given);
  if (!isProvider(options?.model, 'model')) {
    throw new CrucibleError('invalid_config', 'createAgent: `model` must be a provider such as openai({...})');
  }
  refuseMisshapenOptions(options);
  const { byName, specs } = hostToolsOf(options.tools);
  if (options.store !== undefined && (options.store === null || typeof options.store !== 'object')) {
    throw new CrucibleError('invalid_config', 'createAgent: `store` must be a store such as indexedDbStore({...}), nodeStore({...}) or memoryStore()');
  }
  for (const [what, judge] of [['judge', options.emergent?.judge], ['promotionJudge', options.emergent?.promotionJudge]] as const) {
    if (judge === undefined) continue;
    if (!isProvider((judge as { model?: unknown } | null)?.model, `emergent.${what}.model`)) {
      throw new CrucibleError('invalid_config', `createAgent: emergent.${what} must be { model: <provider> }, e.g. { model: openai({...}) }`);
    }
    const { maxTokens, timeoutMs } = judge;
    if (maxTokens !== undefined && !(Number.isInteger(maxTokens) && maxTokens >= 1 && maxTokens <= MAX_U32)) {
      throw new CrucibleError('invalid_config', `createAgent: emergent.${what}.maxTokens must be a whole number of tokens from 1 to ${MAX_U32}, got ${describeValue(maxTokens)}`);
    }
    if (timeoutMs !== undefined && !(Number.isInteger(timeoutMs) && timeoutMs >= 1 && timeoutMs <= MAX_JUDGE_TIMEOUT_MS)) {
      throw new CrucibleError('invalid_config', `createAgent: emergent.${what}.timeoutMs must be a whole number of milliseconds from 1 to ${MAX_JUDGE_TIMEOUT_MS}, got ${describeValue(timeoutMs)}`);
    }
  }
  const signals = new Map<string, AbortSignal>();
  const providerFailures = new Map<string, unknown>();
  const parsedOutputs = new Map<string, unknown>();
  // The agent's own model, whose failure ends a run (a judge's rejects a forge: `adaptJudge`).
  // Its stream closed early (an answer past its bounds) aborts the provider's signal.
  const adapt = (provider: ModelProvider) => ({
    id: provider.id,
    stream(request: ModelRequest, runId: string): AsyncIterator<unknown> {
      // Only a run's failure is handed on (see `besideEvents`); forges and calls outside runs
      // (`direct_…`, or no id) have no run to fail.
      const inRun = runId !== '' && !runId.startsWith('direct_');
      const fail = (error: unknown): never => {
        // Only while the run is going: an aborted run ends at once, and its provider's stream
        // fails after that (its fetch sees the abort); kept then, the error (and the request its
        // stack holds, the session's whole history) would stay for the agent's life.
        if (inRun && signals.has(runId)) providerFailures.set(runId, error);
        throw error;
      };
      let stream: ClosableStream;
      try {
        stream = new ClosableStream(provider, request, signals.get(runId));
      } catch (error) {
        return fail(error);
      }
      const failed = (error: unknown): never => {
        stream.release();
        return fail(error);
      };
      return {
        next: () => {
          // A hand-written provider's `next` may throw, or return no promise (the core awaits either).
          try {
            const step = stream.iterator.next();
            return isThenable(step) ? Promise.resolve(step).then((result) => stream.read(result), failed) : stream.read(step);
          } catch (error) {
            return failed(error);
          }
        },
        return: (value?: unknown) => stream.close(value),
      };
    },
  });
  const modelAdapter = adapt(options.model);
  // The core asks a judge for its default budget; a judge's own replaces it. Every review of
  // every path asks through here, so this is where its deadline lives.
  const adaptJudge = ({ model, maxTokens, timeoutMs = DEFAULT_JUDGE_TIMEOUT_MS }: JudgeOptions, what: string) => ({
    id: model.id,
    stream: (request: ModelRequest, runId: string) =>
      judgeStream(model, maxTokens === undefined ? request : { ...request, maxTokens }, signals.get(runId), timeoutMs, `emergent.${what}.timeoutMs`),
  });
  const hub = new EventHub();
  // Values cross as JSON text both ways, inside the call: the arguments come as the core wrote
  // them, and it gets the JSON text of what `execute` returns (or `undefined`), or a native
  // promise of it, which it reads in one step; a synchronous tool costs no promise round trip.
  const callTool = (name: string, argsJson: string, runId: string, callId: string, sessionId: string): unknown => {
    const hostTool = byName.get(name);
    if (!hostTool) throw new CrucibleError('tool_error', `no host tool named ${name}`);
    const result: unknown = hostTool.execute(JSON.parse(argsJson), { signal: signals.get(runId) ?? NEVER_ABORTED, runId, callId, sessionId });
    // A thenable (a native promise among them) is adopted as a native promise.
    return then(result, jsonText);
  };
  const config = {
    instructions: options.instructions ?? '',
    maxTurns: options.maxTurns,
    maxSteps: options.maxSteps,
    maxParallelTools: options.maxParallelTools,
    maxResultBytes: options.maxResultBytes,
    returns: options.returns ? readingOption('returns', () => toJsonSchema(options.returns!, 'returns')) : undefined,
    maxOutputRetries: options.maxOutputRetries,
    temperature: options.temperature,
    maxTokens: options.maxTokens,
    toolChoice: options.toolChoice,
    resetToolChoice: options.resetToolChoice,
    sessionHistory: options.sessionHistory ?? undefined,
  };
  // The core reads options as JSON, where NaN and ±Infinity are null: an optional setting so
  // given would vanish without a word.
  for (const [key, value] of Object.entries(config)) {
    if (typeof value === 'number' && !Number.isFinite(value)) {
      throw new CrucibleError('invalid_config', `createAgent: ${key} must be a finite number, got ${value}`);
    }
  }
  // With `shown`, the core asks for the arguments to show a human deciding on the call: the
  // parsed ones, or `undefined` for the model's own (see `argumentParsers`).
  const checkApproval = async (name: string, args: unknown, shown?: true) => {
    if (shown) {
      const tool = byName.get(name);
      const parse = tool && argumentParsers.get(tool);
      return parse ? await parse(args) : undefined;
    }
    const predicate = byName.get(name)?.needsApproval;
    // Anything but an explicit `false` waits for a human (fail closed).
    return typeof predicate === 'function' ? (await predicate(args)) !== false : predicate === true;
  };
  // The core reads the id as U+FFFD in place of a lone surrogate: "x\uD800" and "x\uDC00" would
  // share records while counting as two agents for the one-open-registry claim below.
  if (typeof options.agentId === 'string' && hasLoneSurrogate(options.agentId)) {
    throw new CrucibleError('invalid_config', `createAgent: agentId ${JSON.stringify(options.agentId)} has a lone UTF-16 surrogate; it names the agent's records, so it must be well-formed text`);
  }
  const em = options.emergent;
  // Validated before anything is claimed or started: a bad combination is a config error.
  const defaultOnly = em?.enabled ? (['sandboxTimeoutMs', 'sandboxMemoryMB', 'sandboxIdleTimeoutMs', 'fetchDomainAllowlist'] as const).filter((k) => em[k] !== undefined) : [];
  if (em?.sandbox && defaultOnly.length > 0) {
    // Limits given next to a sandbox of the caller's own would be silently ignored.
    throw new CrucibleError(
      'invalid_config',
      `emergent.${defaultOnly.join(', ')} configure the default sandbox; with your own emergent.sandbox, set its limits where you create it (createSandbox({ timeoutMs, memoryMB, idleTimeoutMs, fetchDomainAllowlist }))`,
    );
  }
  refuseUnknownSandboxApis(em?.allowedSandboxAPIs);
  const core = await loadCore();
  const releaseRegistry = em?.enabled && options.store ? await claimRegistry(options.store, options.agentId ?? 'default') : undefined;
  const background = new AbortController();
  let sandbox: SandboxHost | undefined;
  try {
    let emergent: Record<string, unknown> | undefined;
    if (em?.enabled) {
      sandbox = em.sandbox ?? (await defaultSandbox(em));
      // A sandbox of the host's may serve other agents too: its executions say whose they are.
      const coreSandbox = em.sandbox ? forAgent(em.sandbox, options.agentId ?? 'default') : sandbox;
      // The idle timeout is the host pool's alone, the bound on waiting calls `tools.call`'s: the
      // core has no use for them.
      const { judge, promotionJudge, sandbox: _s, sandboxIdleTimeoutMs: _i, maxCallsWaiting: _w, ...rest } = em;
      const judgeModel = judge ? adaptJudge(judge, 'judge') : undefined;
      // Background work's judge and host tool calls find their signal by this id: not a run's,
      // which may end before the work does, but the agent's, which `close()` aborts.
      const backgroundRunId = `background_${newRunId().slice('run_'.length)}`;
      signals.set(backgroundRunId, background.signal);
      emergent = {
        config: stripUndefined({ ...rest }),
        judge: judgeModel,
        promotionJudge: promotionJudge ? adaptJudge(promotionJudge, 'promotionJudge') : judgeModel,
        sandbox: coreSandbox,
        onEvent: hub.dispatch,
        isObserved: hub.isObserved,
        backgroundRunId,
      };
    }
    const parseOutput = options.returns ? readingOption('returns', () => standardParser(options.returns!, 'invalid_output', 'the final answer does not match returns')) : undefined;
    // The schema's own refinements judge each answer its JSON Schema accepted, in the core's
    // loop: a refused answer is asked again with the issues (counting against
    // maxOutputRetries), like a schema violation, and never becomes the run's output. The
    // parse of the accepted one is kept for `run()`, so `validate` runs once per answer. What
    // the parse throws besides issues is its own failure (`output_check_failed`).
    const checkOutput = parseOutput
      ? async (value: unknown, runId: string): Promise<string | undefined> => {
          try {
            parsedOutputs.set(runId, await parseOutput(value));
            return undefined;
          } catch (error) {
            if (error instanceof SchemaIssues) return error.issues;
            throw error;
          }
        }
      : undefined;
    let handle: CoreAgentHandle;
    try {
      handle = (await core.CoreAgent.create(
        stripUndefined(config),
        modelAdapter,
        specs,
        callTool,
        checkApproval,
        options.store,
        { agentId: options.agentId, storeId: options.store ? storeIdOf(options.store) : 0 },
        emergent,
        checkOutput,
      )) as unknown as CoreAgentHandle;
    } catch (error) {
      const e = error as { code?: string; message?: string };
      const message = e?.message ?? String(error);
      // The store opens and loads here: its failures are StoreErrors, as they are later on.
      if (typeof e?.code === 'string' && e.code.startsWith('store_')) {
        throw new StoreError(e.code as Extract<CrucibleErrorCode, `store_${string}`>, message);
      }
      throw new CrucibleError((e?.code as CrucibleErrorCode) ?? 'invalid_config', message);
    }
    const runSupport = { parsedOutputs: parseOutput ? parsedOutputs : undefined, providerFailures, maxCallsWaiting: em?.maxCallsWaiting ?? undefined };
    return new Agent(handle, signals, hub, em?.sandbox ? undefined : sandbox, options.store, releaseRegistry, runSupport, background);
  } catch (error) {
    await (em?.sandbox ? undefined : sandbox?.close?.());
    releaseRegistry?.();
    throw error;
  }
}

/** `createSandbox`'s limits by the names `createAgent` takes them under. */
const AGENT_NAMES_OF_SANDBOX_LIMITS: ReadonlyMap<string, string> = new Map([
  ['timeoutMs', 'sandboxTimeoutMs'],
  ['memoryMB', 'sandboxMemoryMB'],
  ['idleTimeoutMs', 'sandboxIdleTimeoutMs'],
]);

/**
 * `sandbox` as the core of agent `agentId` reaches it: its JSON fast path (see
 * `createSandbox`) tags each execution with the agent, so agents sharing the sandbox take turns
 * and places by agent (see `WorkerPool.next`). A sandbox of one's own without the fast path is
 * handed over as it is.
 */
function forAgent(sandbox: SandboxHost, agentId: string): SandboxHost {
  const executeJson: unknown = (sandbox as unknown as Record<symbol, unknown>)[EXECUTE_JSON];
  if (typeof executeJson !== 'function') return sandbox;
  const view: SandboxHost = { execute: (request, options) => sandbox.execute(request, options) };
  Object.defineProperty(view, EXECUTE_JSON, { value: (requestJson: string) => executeJson.call(sandbox, requestJson, agentId) });
  return view;
}

const EXECUTE_JSON = Symbol.for('crucible.sandbox.executeJson');

/** The default sandbox: a Worker pool with the agent's limits, loaded only when emergent
 * capabilities are enabled (a separate chunk for bundlers). Its Workers (about 28 MB each)
 * start with the first forged code that runs: many agents never run any. */
async function defaultSandbox(em: EmergentOptions): Promise<SandboxHost> {
  const { createSandbox, sandboxLimits } = await import('./sandbox/index.js');
  const options = {
    timeoutMs: em.sandboxTimeoutMs,
    memoryMB: em.sandboxMemoryMB,
    idleTimeoutMs: em.sandboxIdleTimeoutMs,
    fetchDomainAllowlist: em.fetchDomainAllowlist,
    // As many executions wait as `tools.call`s may: with the sandbox's own 256, a burst of 400
    // calls of a forged tool saw 142 turned away.
    maxQueued: em.maxCallsWaiting ?? DEFAULT_MAX_CALLS_WAITING,
    lazy: true,
  };
  // A limit the sandbox refuses is a bad option of createAgent's, named as the caller wrote it.
  try {
    sandboxLimits(options);
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error);
    const named = message.replace(/^\w+/, (word) => AGENT_NAMES_OF_SANDBOX_LIMITS.get(word) ?? word);
    throw new CrucibleError('invalid_config', `createAgent: emergent.${named}`, { cause: error });
  }
  return createSandbox(options);
}

/**
 * The `invalid_config` for options that threw when read (a getter, a Proxy trap), with what
 * they threw as its `cause`. Methods that answer with a promise or a stream fail through it:
 * a throw where the call was made would escape a caller's `.catch` and `for await`.
 */
function unreadableOptions(error: unknown, where: string, code: 'invalid_config' | 'invalid_argument' = 'invalid_config'): CrucibleError {
  if (error instanceof CrucibleError) return error;
  return new CrucibleError(code, `${where}: the options could not be read: ${messageOf(error)}`, { cause: error });
}

/** The run's signal for `collect` (which only names it as an abort's cause); options that
 *  cannot be read have none, and their stream fails on them already. */
function signalOf(options: unknown): AbortSignal | undefined {
  try {
    return (options as RunOptions | null | undefined)?.signal ?? undefined;
  } catch {
    return undefined;
  }
}

/** {@link notSignal} for a run's options, whose reading of the signal's fields may throw too. */
function readSignal(signal: unknown, what: string): CrucibleError | undefined {
  try {
    return notSignal(signal, what, 'invalid_config');
  } catch (error) {
    return unreadableOptions(error, what);
  }
}

/** `signal` checked for the bindings, which take any object for an `AbortSignal`; an already
 *  aborted one rejects before anything starts. */
function abortSignal(signal: unknown, what: string): AbortSignal | undefined {
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
function readOptions<T extends object, K extends keyof T & string>(options: T | undefined | null, what: string, keys: readonly K[]): Partial<Pick<T, K>> {
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

// serde's `default` fills absent fields; `undefined` would not deserialize as absent.
function stripUndefined<T extends Record<string, unknown>>(obj: T): Partial<T> {
  return Object.fromEntries(Object.entries(obj).filter(([, v]) => v !== undefined)) as Partial<T>;
}

/**
 * `createAgent`'s options: their types, and how they are read (once each) and checked before
 * the core sees them, so a wrong or unknown option is an `invalid_config` that names it.
 */
import { CrucibleError, describeType, describeValue, isRecord, messageOf, unknownOptionsError as unknownOptions } from '../errors.js';
import type { ModelProvider, ToolChoice } from '../providers/types.js';
import type { ExecuteOptions, SandboxRequest, SandboxResult } from '../sandbox/types.js';
import type { Store } from '../stores/types.js';
import type { HostTool, JsonSchema, StandardJsonSchemaLike } from '../tool.js';
import { unreadableOptions } from './method-options.js';

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
export const MAX_U32 = 2 ** 32 - 1;
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
export function refuseMisshapenOptions(options: AgentOptions): void {
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
export function unknownOptionsError(given: object, known: ReadonlySet<string>, where: string): CrucibleError | undefined {
  return unknownOptions(given, known, where, OPTION_ALIASES);
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
export function readingOption<T>(name: string, read: () => T): T {
  try {
    return read();
  } catch (error) {
    throw error instanceof CrucibleError ? error : unreadableOption(error, name);
  }
}

/** Whether `value` is a model provider (its `stream` a function). */
export function isProvider(value: unknown, name: string): boolean {
  return readingOption(name, () => typeof (value as { stream?: unknown } | null | undefined)?.stream === 'function');
}

/** A judge's options read once; a model provider given in their place is named as such
 *  (read as options, its own fields were "unknown options"). */
function readJudgeOptions<T>(judge: T, name: 'judge' | 'promotionJudge'): T {
  if (isRecord(judge) && !('model' in judge) && isProvider(judge, `emergent.${name}`)) {
    throw new CrucibleError('invalid_config', `createAgent: emergent.${name} takes options with the judge's model, \`${name}: { model }\`, not the model itself`);
  }
  return readOptionBag(judge, JUDGE_OPTION_NAMES, `emergent.${name}`);
}

/** `createAgent`'s options read once, option bags within them too (see {@link readOptionBag}). */
export function readAgentOptions(options: AgentOptions): AgentOptions {
  const read = readOptionBag(options, AGENT_OPTION_NAMES, '');
  if (!isRecord(read)) return read;
  read.sessionHistory = readOptionBag(read.sessionHistory, SESSION_HISTORY_NAMES, 'sessionHistory');
  const em = readOptionBag(read.emergent, EMERGENT_OPTION_NAMES, 'emergent');
  if (isRecord(em)) {
    em.judge = readJudgeOptions(em.judge, 'judge');
    em.promotionJudge = readJudgeOptions(em.promotionJudge, 'promotionJudge');
    em.promotionThreshold = readOptionBag(em.promotionThreshold, THRESHOLD_OPTION_NAMES, 'emergent.promotionThreshold');
  }
  read.emergent = em;
  return stripUndefined(read as unknown as Record<string, unknown>) as unknown as AgentOptions;
}

/** The host APIs the sandbox can give forged code (`allowedSandboxAPIs`, a request's allowlist). */
const SANDBOX_APIS = ['fetch', 'crypto'];

/** Throws `invalid_config` for an `allowedSandboxAPIs` that is no list of known API names: a
 *  misspelt one (`'Fetch'`) would grant nothing, and forged code would fail for a reason the
 *  configuration hides. */
export function refuseUnknownSandboxApis(apis: unknown): void {
  if (apis === undefined) return;
  // Array.from: a hole of a sparse array is an element too (filter() skips holes).
  const unknown = Array.isArray(apis) ? Array.from(apis).filter((api) => !SANDBOX_APIS.includes(api as string)) : [apis];
  if (unknown.length > 0) {
    const named = unknown.map((api) => (typeof api === 'string' ? JSON.stringify(api) : describeType(api))).join(', ');
    throw new CrucibleError('invalid_config', `createAgent: emergent.allowedSandboxAPIs must list host APIs the sandbox has (${SANDBOX_APIS.join(', ')}); it names ${named}`);
  }
}

// serde's `default` fills absent fields; `undefined` would not deserialize as absent.
export function stripUndefined<T extends Record<string, unknown>>(obj: T): Partial<T> {
  return Object.fromEntries(Object.entries(obj).filter(([, v]) => v !== undefined)) as Partial<T>;
}

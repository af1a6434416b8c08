/**
 * The public agent API: `createAgent()`, `agent.stream()` (an `AsyncIterable` of typed events)
 * and `agent.run()` (a thin collector over the stream). The loop itself runs in the wasm core;
 * this file adapts providers and host tools to it and owns per-run abort signals.
 */
import { loadCore } from './core.js';
import { linkSignals, sharedController } from './signals.js';
import { AbortError, CrucibleError, describeType, describeValue, isRecord, isThenable, MAX_TIMER_MS, StoreError, type CrucibleErrorCode } from './errors.js';
import type { ModelProvider, ModelRequest } from './providers/types.js';
import type { Store } from './stores/types.js';
import { hasLoneSurrogate } from './stores/values.js';
import { DEFAULT_JUDGE_TIMEOUT_MS, judgeStream, MAX_JUDGE_TIMEOUT_MS } from './emergent/judge.js';
import { ClosableStream } from './providers/closable.js';
import { PairedHalves } from './providers/paired-halves.js';
import type { AuditEntry, ForgeRequest, ForgeResult, ForgeStats, PromotionOutcome, Tier, ToolInfo } from './emergent/types.js';
import { argumentParsers, isApprovalRule, refuseNonObjectArguments, SchemaIssues, standardParser, then, toJsonSchema, type HostTool, type InferSchemaOutput, type JsonSchema, type StandardJsonSchemaLike } from './tool.js';
import type { PendingApproval, StoredRun } from '../wasm/crucible_core.js';
import { EventHub, type AgentEvent, type EventListener } from './agent/events.js';
import { argumentsJson, jsonText, MAX_UNITS_INTO_CORE, valueOf } from './agent/json-into-core.js';
import { isProvider, MAX_U32, readAgentOptions, readingOption, refuseMisshapenOptions, refuseUnknownSandboxApis, stripUndefined, unknownOptionsError, type AgentOptions, type JudgeOptions, type SandboxHost } from './agent/agent-options.js';
import {
  abortSignal,
  checkedApprovals,
  importTestCases,
  notString,
  readOptions,
  readSignal,
  requireString,
  RESUME_OPTION_NAMES,
  RUN_OPTION_NAMES,
  sessionOf,
  withJsonSchemas,
  wrongSessionId,
  unreadableOptions,
  type ApprovalDecision,
  type CallOptions,
  type CloseOptions,
  type ForgeOptions,
  type ImportOptions,
  type PromotionOptions,
  type ResumeOptions,
  type RunOptions,
  type SessionOptions,
} from './agent/method-options.js';
import { AgentRunError, besideEvents, collect, toCrucibleError, wrapAsync, type RunResult } from './agent/results.js';
import type { CoreAgentHandle } from './agent/core-handle.js';
import { announceSharedTierChange, attach, claimRegistry, DEFAULT_CLOSE_FLUSH_TIMEOUT_MS, reloadSharedTier, unclosedAgents } from './agent/lifecycle.js';
import { closedWhileCalling, DEFAULT_MAX_CALLS_WAITING, refuseTooManyWaiting } from './agent/waiting-calls.js';
import { defaultSandbox, forAgent } from './agent/default-sandbox.js';

export type { RunUsage, Usage, PendingApproval, StoredRun, Value } from '../wasm/crucible_core.js';
export type { AgentEvent, ErrorInfo, EventBody, ToolFailure } from './agent/events.js';
export type { AgentOptions, EmergentOptions, JudgeOptions, SandboxHost, SessionHistoryOptions } from './agent/agent-options.js';
export type { ApprovalDecision, CallOptions, CloseOptions, ForgeOptions, ImportOptions, PromotionOptions, ResumeOptions, RunOptions, SessionOptions } from './agent/method-options.js';
export type { CompletedRun, FinishReason, PausedRun, RunResult } from './agent/results.js';
export { AgentRunError };

/** The signal each run's event stream was started with, as `stream()` read it from its options:
 *  `run()` hands it to `collect` rather than reading the options a second time (a getter could
 *  answer differently). */
const signalsOfRuns = new WeakMap<object, AbortSignal | undefined>();

/** The signal of host tool calls made outside a run (nothing can abort them); one shared
 * instance, since creating an AbortController per call shows up in call latency. */
const NEVER_ABORTED: AbortSignal = new AbortController().signal;

let runCounter = 0;
function newRunId(): string {
  const random = typeof crypto !== 'undefined' && 'randomUUID' in crypto ? crypto.randomUUID().slice(0, 8) : Math.random().toString(16).slice(2, 10);
  return `run_${random}${(++runCounter).toString(36)}`;
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
      const asJson = withJsonSchemas(request);
      return this.#direct(abortSignal(signal, 'forge'), (abort, runId) => this.#core.forge(asJson, sessionOf(sessionId), label, abort, runId));
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
    if (scope !== undefined && typeof scope !== 'string') return failing(notString(scope, 'agent.run/stream: scope', 'invalid_config'));
    const wrongSession = wrongSessionId(sessionId, 'agent.run/stream: sessionId', 'invalid_config');
    if (wrongSession) return failing(wrongSession);
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
    const events = this.resumeStream(run, options);
    return collect<O>(events, signalsOfRuns.get(events));
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
    signalsOfRuns.set(events, outerSignal);
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
    const events = this.stream(input, options);
    return collect<O>(events, signalsOfRuns.get(events));
  }

  /** The conversation of a session so far: what is kept of it within `sessionHistory`, and
   *  what its next run sends the model. */
  history(sessionId = 'default'): unknown[] {
    this.#assertOpen('history');
    return this.#core.history(sessionOf(sessionId, 'history: sessionId')) as unknown[];
  }

  /** Forgets a session's conversation and discards its session-tier tools. */
  async endSession(sessionId = 'default'): Promise<void> {
    this.#assertOpen('endSession');
    await wrapAsync(() => this.#core.endSession(sessionOf(sessionId, 'endSession: sessionId')));
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
    // Timers fire at once past MAX_TIMER_MS: a longer wait would give up on the flush at once.
    if (!(typeof flushTimeoutMs === 'number' && flushTimeoutMs >= 0 && flushTimeoutMs <= MAX_TIMER_MS)) {
      return Promise.reject(new CrucibleError('invalid_argument', `close: flushTimeoutMs must be a number of ms from 0 to ${MAX_TIMER_MS}, got ${describeValue(flushTimeoutMs)}`));
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
      const halves = new PairedHalves();
      return {
        next: () => {
          const queued = halves.takeQueued();
          // Not a promise: the core awaits either.
          if (queued !== undefined) return queued as Promise<IteratorResult<unknown>>;
          // A hand-written provider's `next` may throw, or return no promise (the core awaits either).
          try {
            const step = stream.iterator.next();
            return isThenable(step) ? Promise.resolve(step).then((result) => halves.join(stream.read(result)), failed) : halves.join(stream.read(step));
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

/**
 * How the property tests of the public boundary (`fuzz-boundary*.test.ts`) run a generated
 * case and judge it against the project's standard: the promise settles, a failure is a
 * CrucibleError with a known code and no trace of a wasm trap, and nothing is lost (the tools
 * registered before are listed and answer, a known-good forge succeeds). Also the test doubles
 * the properties share: a judge that approves, models that are never asked or follow a script.
 */
import { after, before } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { createAgent, CrucibleError, tool, type Agent, type CrucibleErrorCode, type ModelProvider } from '../../src/node.js';
import type { ForgeRequest } from '../../src/emergent/types.js';
import { SLUGIFY_FORGE } from './forge-fixtures.js';
import { fcParams, shown } from './fuzz-arbitraries.js';

/** Every code of `CrucibleErrorCode` (npm/src/errors.ts) but `internal`, the catch-all of
 *  failures nobody foresaw: one of those is what these tests look for. The `satisfies` makes a
 *  code added to the type and not here (or one here the type no longer has) a type error. */
const KNOWN_CODES: ReadonlySet<string> = new Set(
  Object.keys({
    provider_http: true, provider_timeout: true, provider_network: true, provider_protocol: true, aborted: true, max_turns_exceeded: true,
    max_steps_exceeded: true, structured_output_invalid: true, invalid_config: true, invalid_argument: true, invalid_resume: true, invalid_state: true,
    store_error: true, store_quota: true, store_blocked: true, store_corrupt: true, sandbox_error: true, tool_error: true,
    unknown_tool: true, invalid_arguments: true, invalid_output: true, denied: true, execution_failed: true, result_too_large: true,
    sandbox_timeout: true, sandbox_memory: true, sandbox_rejected: true, sandbox_unavailable: true, emergent_disabled: true, tool_not_found: true,
    lowest_tier: true, no_such_version: true, unreviewed_version: true, pipeline_cycle: true, no_such_approval: true, invalid_promotion: true,
    invalid_package: true, output_check_failed: true, closed: true, too_many_calls: true, core_unavailable: true,
  } satisfies Record<Exclude<CrucibleErrorCode, 'internal'>, true>),
);
const REJECTION_CATEGORIES = new Set(['schema_extra_field', 'shape_check', 'syntax_error', 'parse_error', 'judge_correctness', 'other']);

/** What a trap of the core's wasm instance (a panic, an out-of-bounds access, a stack
 *  overflow, which V8 reports as "Maximum call stack size exceeded") or a misused binding
 *  looks like once it reaches JavaScript. */
const TRAP = /unreachable|RuntimeError|memory access out of bounds|null pointer passed to rust|recursive use of an object|already borrowed|Maximum call stack|panicked/i;

/** Longest a single generated case may take before it counts as never settling (a sandbox
 *  test of looping code takes its 1.5 s deadline and a Worker restart). */
const SETTLE_MS = 20_000;

/** What `start()` settles to. Fails when it has not settled within `ms`, or threw where it
 *  was called: an API that answers with a promise fails through it. */
export async function settles<T>(start: () => Promise<T>, what: string, ms = SETTLE_MS): Promise<{ ok: true; value: T } | { ok: false; error: unknown }> {
  let promise: Promise<T>;
  try {
    promise = start();
  } catch (error) {
    assert.fail(`${what} threw where it was called instead of rejecting: ${errorText(error)}`);
  }
  const late = new Error(`${what} did not settle within ${ms} ms`);
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(late), ms)));
  try {
    return { ok: true, value: await Promise.race([promise, deadline]) };
  } catch (error) {
    if (error === late) throw error;
    return { ok: false, error };
  } finally {
    clearTimeout(timer);
  }
}

/** Text of an error and of its causes (a cause may be any thrown value, one that throws when
 *  read among them). */
export function errorText(error: unknown): string {
  const parts: string[] = [];
  let e: unknown = error;
  for (let i = 0; e !== undefined && i < 5; i++) {
    try {
      parts.push(e instanceof Error ? `${e.name}: ${e.message}` : String(e));
      e = (e as { cause?: unknown } | null)?.cause;
    } catch {
      parts.push('(a value that throws when read)');
      break;
    }
  }
  return parts.join(' <- ');
}

/** `code: message` of a failure, shortened, for {@link tally}. */
export function label(error: unknown, chars = 60): string {
  const text = errorText(error).split(' <- ')[0]!.replace(/^\w+: /, '');
  return `${(error as { code?: string } | null)?.code ?? '(no code)'}: ${text.slice(0, chars)}`;
}

/** What the generated hostile values throw themselves (a getter, a Proxy trap, `toJSON`). */
const PLANTED = /^(ownKeys trap throws|get trap throws|getter throws|toJSON throws|toString throws)$/;

/** The failure is typed: a CrucibleError with a known code, and no trace of a trap. With
 *  `passThrough`, an error a hostile argument threw itself may come back as it is (a model
 *  provider that is a Proxy whose trap throws: its caller's own error). */
export function assertTyped(error: unknown, what: string, passThrough = false): void {
  if (passThrough && error instanceof Error && PLANTED.test(error.message)) return;
  assert.ok(error instanceof CrucibleError, `${what} failed with ${errorText(error)}, not a CrucibleError`);
  assert.ok(KNOWN_CODES.has(error.code), `${what} failed with code ${error.code}: ${error.message}`);
  assert.doesNotMatch(errorText(error), TRAP, `${what} failed with a trace of a wasm trap: ${errorText(error).slice(0, 500)}`);
}

/** A forge's answer is a ForgeResult: a success, or a reason with a known category. */
export function assertForgeResult(res: unknown, what: string): void {
  assert.ok(res !== null && typeof res === 'object', `${what} resolved with ${shown(res)}`);
  const r = res as { success?: unknown; reason?: unknown; category?: unknown };
  assert.equal(typeof r.success, 'boolean', `${what} resolved with ${shown(res)}`);
  if (r.success === false) {
    assert.equal(typeof r.reason, 'string');
    assert.ok(REJECTION_CATEGORIES.has(r.category as string), `${what}: unknown category ${String(r.category)}`);
    assert.doesNotMatch(r.reason as string, TRAP, `${what}: a trace of a trap in the rejection's reason: ${(r.reason as string).slice(0, 500)}`);
  }
}

/**
 * Runs `property` (with the fixed seed, or FC_SEED; `runs` cases, or FC_RUNS) and fails with
 * its counterexample and error, both shortened: a generated string may be a million characters.
 */
export async function check<Ts extends unknown[]>(property: fc.IAsyncPropertyWithHooks<Ts>, runs: number): Promise<void> {
  const details = await fc.check(property, fcParams(runs));
  if (!details.failed) return;
  const counterexample = details.counterexample?.map(shown).join(', ') ?? '(none)';
  const failure = (details.errorInstance as Error | undefined)?.stack ?? String(details.errorInstance);
  assert.fail(`property failed after ${details.numRuns} run(s) (seed ${details.seed}, path "${details.counterexamplePath}"; FC_SEED=${details.seed} replays it)\ncounterexample: ${counterexample}\n${failure.slice(0, 2000)}`);
}

/** Counts how generated cases ended, by kind; FC_STATS=1 prints them, to see that the
 *  generators reach past the first check. */
export class Tally {
  readonly #counts = new Map<string, number>();
  constructor(readonly what: string) {}
  add(kind: string): void {
    this.#counts.set(kind, (this.#counts.get(kind) ?? 0) + 1);
  }
  report(): void {
    if (process.env.FC_STATS) console.log(this.what, Object.fromEntries([...this.#counts].sort((a, b) => b[1] - a[1])));
  }
}

/** Fails the file's tests on a rejection nobody handled (a Node service ends on one). */
export function failOnUnhandledRejections(): void {
  const unhandled: unknown[] = [];
  const onUnhandled = (reason: unknown) => void unhandled.push(reason);
  before(() => process.on('unhandledRejection', onUnhandled));
  after(() => {
    process.off('unhandledRejection', onUnhandled);
    assert.deepEqual(unhandled.map(errorText), [], 'unhandled rejections');
  });
}

// ---------------------------------------------------------------------------------------------
// Test doubles and the tools every property's agent has

const VERDICT = { approved: true, safety: 0.95, correctness: 0.95, determinism: 0.95, boundedness: 0.9, confidence: 0.9, reasoning: 'ok' };

/** Test double of the judge: approves every forge. */
export const approvingJudge: ModelProvider = {
  id: 'test-double:approving-judge',
  async *stream() {
    yield { type: 'text', delta: JSON.stringify(VERDICT) };
    yield { type: 'finish', finishReason: 'stop' };
  },
};

/** Test double of a chat model that is never asked (forges and calls outside runs). */
export const unusedModel: ModelProvider = {
  id: 'test-double:unused-model',
  // eslint-disable-next-line require-yield
  async *stream() {
    throw new Error('the chat model is not part of this test');
  },
};

/** One step of a {@link ScriptedChatModel}'s answer: a chunk it yields, or a value it throws. */
export type ScriptStep = { chunk: unknown } | { throws: unknown };

/** The plain answer of a {@link ScriptedChatModel}. */
const FINE: ScriptStep[] = [{ chunk: { type: 'text', delta: 'fine' } }, { chunk: { type: 'finish', finishReason: 'stop' } }];

/**
 * Test double of a chat model: the answers after {@link ScriptedChatModel.play} are the ones
 * given (chunks of any shape, throws of any value), in order; every later one is the plain
 * text `fine`.
 */
export class ScriptedChatModel implements ModelProvider {
  readonly id = 'test-double:scripted-chat';
  #answers: ScriptStep[][] = [];
  /** The next answers are these. */
  play(...answers: ScriptStep[][]): void {
    this.#answers = answers;
  }
  /** The next answer is `fine`. */
  plain(): void {
    this.#answers = [];
  }
  async *stream(): AsyncGenerator<never> {
    for (const step of this.#answers.shift() ?? FINE) {
      if ('throws' in step) throw step.throws;
      yield step.chunk as never;
    }
  }
}

export const upper = tool({
  name: 'upper',
  description: 'Uppercases text',
  inputSchema: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'] },
  execute: ({ text }: { text: string }) => ({ text: text.toUpperCase() }),
});
export const add = tool({
  name: 'add',
  description: 'Adds two numbers',
  inputSchema: { type: 'object', properties: { a: { type: 'number' }, b: { type: 'number' } }, required: ['a', 'b'] },
  execute: ({ a, b }: { a: number; b: number }) => ({ sum: a + b }),
});

/** A compose tool over the host tool `upper`. */
export const SHOUT_FORGE: ForgeRequest = {
  name: 'shout',
  description: 'Uppercases text through upper',
  inputSchema: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'] },
  outputSchema: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'] },
  implementation: { mode: 'compose', steps: [{ name: 'up', tool: 'upper', inputMapping: { text: '$input.text' } }] },
  testCases: [
    { input: { text: 'hi' }, expectedOutput: { text: 'HI' } },
    { input: { text: 'a b' }, expectedOutput: { text: 'A B' } },
  ],
};

/** The session whose tools must survive every case. */
export const KEEP = { sessionId: 'keep' };

/** An agent with `upper`, `add`, emergent capabilities and the approving judge; forged code
 *  gets a 1.5 s deadline, so looping code costs a case little. */
export async function emergentAgent(model: ModelProvider = unusedModel, extra: Record<string, unknown> = {}): Promise<Agent> {
  return createAgent({
    model,
    tools: [upper, add],
    maxTurns: 4,
    maxSteps: 8,
    emergent: { enabled: true, judge: { model: approvingJudge }, persistSandboxSource: true, sandboxTimeoutMs: 1500, autoPromote: false, ...extra },
  });
}

/** Forges `shout` (compose) and `slugify` (sandbox), the tools {@link assertStillServing} looks for. */
export async function forgeKeptTools(agent: Agent, session = KEEP): Promise<void> {
  for (const request of [SHOUT_FORGE, SLUGIFY_FORGE]) {
    const res = await agent.forge(request, session);
    assert.ok(res.success, JSON.stringify(res));
  }
}

let probes = 0;
/**
 * Nothing was lost and the instance keeps serving: the kept tools are listed and answer (the
 * compose one in the core, the sandbox one in a Worker), and a fresh forge succeeds.
 */
export async function assertStillServing(agent: Agent, what: string): Promise<void> {
  const names = agent.tools.list(KEEP).map((t) => t.name).sort();
  assert.deepEqual(names, ['shout', 'slugify'], `${what}: the kept session's tools changed`);
  assert.deepEqual(await agent.tools.call('shout', { text: 'still here' }, KEEP), { text: 'STILL HERE' }, `${what}: the compose tool`);
  assert.deepEqual(await agent.tools.call('slugify', { text: 'Still Here' }, KEEP), { slug: 'still-here' }, `${what}: the sandbox tool`);
  const session = `probe-${++probes}`;
  const forged = await agent.forge({ ...SHOUT_FORGE, name: 'probe_shout' }, { sessionId: session });
  assert.ok(forged.success, `${what}: a known-good forge failed: ${shown(forged)}`);
  await agent.endSession(session);
}

/** A run of the plain answer completes: the agent, and the core under it, keep serving. */
export async function assertRunsServe(agent: Agent, model: ScriptedChatModel, what: string): Promise<void> {
  model.plain();
  const run = await settles(() => agent.run('hi', { sessionId: 'probe' }), 'a known-good run');
  assert.ok(run.ok, `${what}: a known-good run failed: ${run.ok ? '' : errorText(run.error)}`);
  assert.equal(run.value.status === 'completed' && run.value.text, 'fine', `${what}: a known-good run`);
  await agent.endSession('probe');
}

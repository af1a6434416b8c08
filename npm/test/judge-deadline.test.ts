// A judge that never answers must not hang anything: every review (a forge's, an import's, each
// promotion panel reviewer's, asked for or automatic) fails closed at the judge's `timeoutMs`,
// and the provider's signal aborts so it can stop. The judges here are test doubles.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { AbortError, createAgent, memoryStore, tool, type AgentEvent, type ModelChunk, type ModelProvider } from '../src/node.js';
import { SLUGIFY_FORGE as slugify, verdictReply } from './support/forge-fixtures.js';

/** What the judge double does with a request: answer with an approving verdict, say nothing
 *  for good, write half a verdict and then nothing, or answer once its `gate` opens. Never
 *  settling ignores the signal too. */
type JudgeMode = 'answer' | 'silent' | 'half' | 'gated';

/** A judge double whose mode can change between reviews; it keeps the signal of each request. */
function judgeDouble(mode: JudgeMode = 'answer') {
  const double = {
    mode,
    signals: [] as AbortSignal[],
    gate: Promise.resolve(),
    provider: {
      id: 'test-double:judge',
      async *stream(_request, options) {
        double.signals.push(options!.signal!);
        if (double.mode === 'gated') await double.gate;
        if (double.mode === 'answer' || double.mode === 'gated') {
          yield { type: 'text', delta: String(verdictReply(true).text) };
          yield { type: 'finish', finishReason: 'stop' };
          return;
        }
        if (double.mode === 'half') yield { type: 'text', delta: '{"approved": true, "safety": 0.9' };
        await new Promise<never>(() => {});
      },
    } satisfies ModelProvider,
  };
  return double;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** `promise`, or a failure once `ms` passed: what should not wait for a review fails instead of
 *  hanging the suite. */
const inTime = <T>(promise: Promise<T>, ms = 2000): Promise<T> =>
  Promise.race([promise, sleep(ms).then((): never => assert.fail(`still pending after ${ms} ms`))]);

const deadline = (ms: number, option = 'judge') => new RegExp(`the judge did not answer: no complete verdict within ${ms} ms \\(emergent\\.${option}\\.timeoutMs\\)`);

/** An agent that forged slugify in session s1, promoting after `uses` uses, whose panel
 *  answers only once `answer()` is called; `seen` collects its events. */
async function gatedPanelAgent(uses: number) {
  const judge = judgeDouble();
  const panel = judgeDouble('gated');
  let answer!: () => void;
  panel.gate = new Promise((resolve) => (answer = resolve));
  const agent = await createAgent({
    model: judge.provider,
    emergent: { enabled: true, judge: { model: judge.provider }, promotionJudge: { model: panel.provider }, promotionThreshold: { uses } },
  });
  const seen: AgentEvent[] = [];
  agent.on((e) => seen.push(e));
  assert.ok((await agent.forge(slugify, { sessionId: 's1' })).success);
  return { agent, panel, answer, seen };
}

describe("a judge's timeoutMs bounds every review", () => {
  test('a forge whose judge never answers, or stalls mid-verdict, is rejected at the deadline and the provider sees its signal aborted', async () => {
    const judge = judgeDouble();
    const agent = await createAgent({ model: judge.provider, store: memoryStore(), emergent: { enabled: true, judge: { model: judge.provider, timeoutMs: 150 }, persistSandboxSource: true } });
    for (const mode of ['silent', 'half'] as const) {
      judge.mode = mode;
      const started = Date.now();
      const res = await agent.forge({ ...slugify, name: `slugify_${mode}` }, { sessionId: 's1' });
      const took = Date.now() - started;
      assert.ok(!res.success, JSON.stringify(res));
      assert.match(res.reason, deadline(150));
      assert.equal(res.category, 'other');
      assert.ok(took >= 140 && took < 2000, `${mode}: the forge ended after ${took} ms`);
      assert.equal(judge.signals.at(-1)!.aborted, true, `${mode}: the provider's signal aborted`);
    }
    // An import is judged the same way.
    judge.mode = 'answer';
    assert.ok((await agent.forge(slugify, { sessionId: 's1' })).success);
    const pkg = await agent.emergent.export('slugify', { sessionId: 's1' });
    judge.mode = 'silent';
    const imported = await agent.emergent.import(pkg, { sessionId: 's2' });
    assert.ok(!imported.success && deadline(150).test(imported.reason), JSON.stringify(imported));
    assert.deepEqual(agent.tools.list({ sessionId: 's2' }), []);
    // The agent keeps serving, and a review that finished in time left its signal alone.
    judge.mode = 'answer';
    assert.ok((await agent.forge({ ...slugify, name: 'slugify_later' }, { sessionId: 's1' })).success);
    assert.equal(judge.signals.at(-1)!.aborted, false);
    await agent.close();
  });

  test('requestPromotion whose panel does not answer is not granted, says why, and is not held against the tool: asked again with a working judge, it promotes', async () => {
    const judge = judgeDouble();
    const agent = await createAgent({
      model: judge.provider,
      store: memoryStore(),
      emergent: { enabled: true, judge: { model: judge.provider, timeoutMs: 100 }, autoPromote: false, promotionThreshold: { uses: 2 } },
    });
    assert.ok((await agent.forge(slugify, { sessionId: 's1' })).success);
    for (const text of ['a b', 'c d']) await agent.tools.call('slugify', { text }, { sessionId: 's1' });
    judge.mode = 'half';
    const started = Date.now();
    const out = await agent.emergent.requestPromotion('slugify', 'agent', { sessionId: 's1' });
    assert.ok(Date.now() - started < 2000, `it ended after ${Date.now() - started} ms`);
    assert.equal(out.status, 'rejected');
    assert.match(out.reason, deadline(100));
    assert.equal(judge.signals.at(-1)!.aborted, true);
    assert.deepEqual(agent.tools.list({ sessionId: 's1' }).map((t) => t.tier), ['session']);
    assert.deepEqual(await agent.tools.call('slugify', { text: 'Still Here' }, { sessionId: 's1' }), { slug: 'still-here' });
    judge.mode = 'answer';
    const again = await agent.emergent.requestPromotion('slugify', 'agent', { sessionId: 's1' });
    assert.equal(again.status, 'promoted', JSON.stringify(again));
    await agent.close();
  });

  test('requestPromotion takes a signal: aborting it rejects with AbortError, aborts the judge request, and records nothing', async () => {
    const judge = judgeDouble();
    const agent = await createAgent({ model: judge.provider, emergent: { enabled: true, judge: { model: judge.provider }, autoPromote: false, promotionThreshold: { uses: 1 } } });
    const seen: AgentEvent[] = [];
    agent.on((e) => seen.push(e));
    assert.ok((await agent.forge(slugify, { sessionId: 's1' })).success);
    await agent.tools.call('slugify', { text: 'a b' }, { sessionId: 's1' });
    judge.mode = 'silent';
    const started = Date.now();
    await assert.rejects(
      agent.emergent.requestPromotion('slugify', 'agent', { sessionId: 's1', signal: AbortSignal.timeout(100) }),
      (e: unknown) => e instanceof AbortError && e.code === 'aborted',
    );
    assert.ok(Date.now() - started < 2000, `it ended after ${Date.now() - started} ms (the default deadline is 120 s)`);
    assert.equal(judge.signals.at(-1)!.aborted, true, "the panel reviewer's request got the signal");
    assert.ok(!seen.some((e) => e.type === 'promotion.rejected'), 'an abort is no rejection');
    const aborted = new AbortController();
    aborted.abort();
    await assert.rejects(agent.emergent.requestPromotion('slugify', 'agent', { sessionId: 's1', signal: aborted.signal }), AbortError);
    await assert.rejects(agent.emergent.requestPromotion('slugify', 'agent', { sessionId: 's1', signal: 'stop' as never }), { code: 'invalid_argument' });
    judge.mode = 'answer';
    assert.equal((await agent.emergent.requestPromotion('slugify', 'agent', { sessionId: 's1' })).status, 'promoted');
    await agent.close();
  });

  test('import takes a signal: aborting it rejects with AbortError, aborts the judge request, and records nothing', async () => {
    const judge = judgeDouble();
    const agent = await createAgent({ model: judge.provider, emergent: { enabled: true, judge: { model: judge.provider }, persistSandboxSource: true } });
    assert.ok((await agent.forge(slugify, { sessionId: 's1' })).success);
    const pkg = await agent.emergent.export('slugify', { sessionId: 's1' });
    const audited = (await agent.emergent.audit()).length;
    judge.mode = 'silent';
    const started = Date.now();
    await assert.rejects(agent.emergent.import(pkg, { sessionId: 's2', signal: AbortSignal.timeout(100) }), (e: unknown) => e instanceof AbortError && e.code === 'aborted');
    assert.ok(Date.now() - started < 2000, `it ended after ${Date.now() - started} ms (the default deadline is 120 s)`);
    assert.equal(judge.signals.at(-1)!.aborted, true, "the judge's request got the signal");
    assert.deepEqual(agent.tools.list({ sessionId: 's2' }), []);
    assert.equal((await agent.emergent.audit()).length, audited, 'nothing recorded');
    await assert.rejects(agent.emergent.import(pkg, { sessionId: 's2', signal: 'stop' as never }), { code: 'invalid_argument' });
    judge.mode = 'answer';
    assert.ok((await agent.emergent.import(pkg, { sessionId: 's2' })).success);
    await agent.close();
  });


  test("close() ends a direct forge or import whose judge is answering with the closed error, and aborts the judge's request: it does not wait for the judge's deadline", async () => {
    const judge = judgeDouble();
    const agent = await createAgent({ model: judge.provider, store: memoryStore(), emergent: { enabled: true, judge: { model: judge.provider }, persistSandboxSource: true } });
    assert.ok((await agent.forge(slugify, { sessionId: 's1' })).success);
    const pkg = await agent.emergent.export('slugify', { sessionId: 's1' });
    judge.mode = 'silent';
    const asked = judge.signals.length;
    const caller = new AbortController();
    const pending = [
      agent.forge({ ...slugify, name: 'slugify_two' }, { sessionId: 's1' }),
      agent.forge({ ...slugify, name: 'slugify_three' }, { sessionId: 's1', signal: caller.signal }),
      agent.emergent.import(pkg, { sessionId: 's2' }),
    ];
    const settled = Promise.allSettled(pending);
    while (judge.signals.length < asked + pending.length) await sleep(5);
    await inTime(agent.close());
    // Before, each waited for its judge, up to its timeoutMs (120 s by default).
    const outcomes = await inTime(settled);
    for (const outcome of outcomes) {
      assert.ok(outcome.status === 'rejected' && (outcome.reason as { code?: string }).code === 'closed', JSON.stringify(outcome, (_k, v) => (v instanceof Error ? `${v.name}: ${v.message}` : v)));
    }
    assert.ok(judge.signals.slice(asked).every((s) => s.aborted), "every judge request's signal aborted");
    assert.equal(caller.signal.aborted, false, "the caller's own signal is left alone");
  });
  test('an automatic promotion whose panel stalls does not break the call that started it, and the uses after it are not held for the deadline', async () => {
    const judge = judgeDouble();
    const panel = judgeDouble('silent');
    const agent = await createAgent({
      model: judge.provider,
      emergent: { enabled: true, judge: { model: judge.provider }, promotionJudge: { model: panel.provider, timeoutMs: 100 }, promotionThreshold: { uses: 2 } },
    });
    const seen: AgentEvent[] = [];
    agent.on((e) => seen.push(e));
    assert.ok((await agent.forge(slugify, { sessionId: 's1' })).success);
    assert.deepEqual(await agent.tools.call('slugify', { text: 'A b' }, { sessionId: 's1' }), { slug: 'a-b' });
    // The second use reaches the threshold: the panel is asked and never answers.
    assert.deepEqual(await agent.tools.call('slugify', { text: 'C d' }, { sessionId: 's1' }), { slug: 'c-d' });
    await agent.emergent.settled();
    const rejected = seen.filter((e) => e.type === 'promotion.rejected');
    assert.equal(rejected.length, 1);
    assert.ok(rejected[0]?.type === 'promotion.rejected' && deadline(100, 'promotionJudge').test(rejected[0].reason), JSON.stringify(rejected));
    assert.equal(panel.signals.length, 1);
    assert.equal(panel.signals[0]!.aborted, true);
    // The next use is not held for another deadline; an explicit request asks at once.
    assert.deepEqual(await agent.tools.call('slugify', { text: 'E f' }, { sessionId: 's1' }), { slug: 'e-f' });
    assert.equal(panel.signals.length, 1, 'not asked again by the next use');
    panel.mode = 'answer';
    assert.equal((await agent.emergent.requestPromotion('slugify', 'agent', { sessionId: 's1' })).status, 'promoted');
    await agent.close();
  });

  test("a run that ends while its tool call's automatic promotion waits on the panel leaves the review going; close() aborts it and records nothing", async () => {
    const judge = judgeDouble();
    const panel = judgeDouble('silent');
    // The run's model calls the forged tool, whose second use reaches the threshold, then answers.
    let turns = 0;
    const caller: ModelProvider = {
      id: 'test-double:caller',
      async *stream() {
        if (turns++ === 0) {
          yield { type: 'tool_call', index: 0, id: 'c1', name: 'slugify', argumentsDelta: '{"text":"A b"}' };
          yield { type: 'finish', finishReason: 'tool_calls' };
          return;
        }
        yield { type: 'text', delta: 'Done.' };
        yield { type: 'finish', finishReason: 'stop' };
      },
    };
    const store = memoryStore();
    const agent = await createAgent({
      model: caller,
      store,
      emergent: { enabled: true, judge: { model: judge.provider }, promotionJudge: { model: panel.provider }, promotionThreshold: { uses: 2 } },
    });
    const seen: AgentEvent[] = [];
    agent.on((e) => seen.push(e));
    assert.ok((await agent.forge(slugify, { sessionId: 's1' })).success);
    await agent.tools.call('slugify', { text: 'x' }, { sessionId: 's1' });
    await inTime(agent.run('slugify something', { sessionId: 's1' }));
    while (panel.signals.length === 0) await sleep(5);
    await sleep(20);
    assert.equal(panel.signals[0]!.aborted, false, 'the run ended; the review goes on');
    const audited = (await store.scan('agent/default/audit/')).length;
    await inTime(agent.close());
    assert.equal(panel.signals[0]!.aborted, true, "close() aborted the panel reviewer's request");
    assert.equal(panel.signals.length, 1);
    assert.ok(!seen.some((e) => e.type === 'tool.promoted' || e.type === 'promotion.rejected'), seen.map((e) => e.type).join(','));
    assert.equal((await store.scan('agent/default/audit/')).length, audited, 'nothing audited');
  });

  test('the call that reaches the promotion threshold returns while the panel reviews; settled() resolves once the promotion landed', async () => {
    const { agent, panel, answer, seen } = await gatedPanelAgent(2);
    await agent.tools.call('slugify', { text: 'A b' }, { sessionId: 's1' });
    assert.deepEqual(await inTime(agent.tools.call('slugify', { text: 'C d' }, { sessionId: 's1' })), { slug: 'c-d' }, 'the result, without waiting for the panel');
    while (panel.signals.length === 0) await sleep(5);
    // A use while the review runs starts no second one.
    assert.deepEqual(await inTime(agent.tools.call('slugify', { text: 'E f' }, { sessionId: 's1' })), { slug: 'e-f' });
    let settled = false;
    const settling = agent.emergent.settled().then(() => (settled = true));
    await sleep(20);
    assert.equal(settled, false, 'the review is in flight');
    assert.equal(panel.signals.length, 1, 'one review at a time');
    assert.deepEqual(agent.tools.list({ sessionId: 's1' }).map((t) => t.tier), ['session']);
    answer();
    await inTime(settling);
    assert.equal(panel.signals.length, 2, 'both reviewers answered');
    assert.deepEqual(agent.tools.list({ sessionId: 's1' }).map((t) => t.tier), ['agent']);
    const promoted = seen.filter((e) => e.type === 'tool.promoted');
    assert.deepEqual(promoted.map((e) => e.type === 'tool.promoted' && [e.name, e.toTier, e.runId]), [['slugify', 'agent', '']]);
    assert.equal(agent.emergent.audit().filter((a) => a.action === 'promote').length, 1);
    await agent.emergent.settled(); // with nothing in flight, at once
    await agent.close();
  });

  test('endSession while a background promotion is reviewed: what the panel approves still reaches the agent tier', async () => {
    const { agent, panel, answer, seen } = await gatedPanelAgent(1);
    await agent.tools.call('slugify', { text: 'A b' }, { sessionId: 's1' });
    while (panel.signals.length === 0) await sleep(5);
    // A service ends the session once its request is answered.
    await agent.endSession('s1');
    answer();
    await inTime(agent.emergent.settled());
    assert.deepEqual(agent.tools.list({ sessionId: 's2' }).map((t) => [t.name, t.tier]), [['slugify', 'agent']]);
    assert.deepEqual(seen.filter((e) => e.type === 'tool.promoted').map((e) => e.type === 'tool.promoted' && e.name), ['slugify']);
    await agent.close();
  });

  test("the host tools a background promotion's test re-run calls get the agent's signal, which close() aborts", async () => {
    const judge = judgeDouble();
    const textSchema = { type: 'object', properties: { text: { type: 'string' } }, required: ['text'] } as const;
    let holding = false;
    const held: { signal: AbortSignal; runId: string }[] = [];
    const relay = tool({
      name: 'relay',
      description: 'Echoes its text',
      inputSchema: textSchema,
      execute: async ({ text }: { text: string }, { signal, runId }) => {
        if (holding && text !== 'use') {
          held.push({ signal, runId });
          await new Promise((resolve) => signal.addEventListener('abort', resolve));
        }
        return { text };
      },
    });
    const agent = await createAgent({ model: judge.provider, tools: [relay], emergent: { enabled: true, judge: { model: judge.provider }, promotionThreshold: { uses: 1 } } });
    const pipeline = {
      name: 'x',
      description: 'Relays the text',
      inputSchema: textSchema,
      outputSchema: textSchema,
      implementation: { mode: 'compose', steps: [{ name: 'r', tool: 'relay', inputMapping: { text: '$input.text' } }] },
      testCases: [{ input: { text: 'a' }, expectedOutput: { text: 'a' } }, { input: { text: 'b' }, expectedOutput: { text: 'b' } }],
    };
    assert.ok((await agent.forge(pipeline, { sessionId: 's1' })).success);
    holding = true;
    // The use reaches the threshold; the promotion's re-run of the tests holds in `relay`.
    assert.deepEqual(await inTime(agent.tools.call('x', { text: 'use' }, { sessionId: 's1' })), { text: 'use' });
    while (held.length === 0) await sleep(5);
    assert.match(held[0]!.runId, /^background_/, "the agent's background run id, not the call's");
    assert.equal(held[0]!.signal.aborted, false);
    await inTime(agent.close());
    assert.equal(held[0]!.signal.aborted, true, 'close() aborted it');
  });

  test('a judge whose stream stays open after its finish is read no further: its verdict counts, not the deadline', async () => {
    // A hand-written provider (a socket, a queue) may finish its answer before it ends its
    // stream; the verdict is complete at the finish.
    let closed = 0;
    const lingering: ModelProvider = {
      id: 'test-double:lingering-judge',
      async *stream() {
        try {
          yield { type: 'text', delta: String(verdictReply(true).text) };
          yield { type: 'finish', finishReason: 'stop' };
          await new Promise<never>(() => {});
        } finally {
          closed++;
        }
      },
    };
    const agent = await createAgent({ model: lingering, emergent: { enabled: true, judge: { model: lingering, timeoutMs: 1000 } } });
    const started = Date.now();
    const res = await agent.forge(slugify, { sessionId: 's1' });
    assert.ok(res.success, JSON.stringify(res));
    assert.ok(Date.now() - started < 1000, `the forge ended after ${Date.now() - started} ms`);
    assert.equal(closed, 1, 'the stream was closed (return()) once its verdict was read');
    await agent.close();
  });

  test('a judge that answers with tool calls without end is read no further than the first: the forge is rejected at once (parse_error), not at the deadline', async () => {
    // A judge's request offers no tools, so a call is no part of a verdict; read on, calls
    // streamed without end would hold the review until its deadline while the provider keeps them.
    let pieces = 0;
    let closed = 0;
    const calling: ModelProvider = {
      id: 'test-double:calling-judge',
      async *stream() {
        try {
          for (;;) {
            pieces++;
            yield { type: 'tool_call', index: pieces, id: `c${pieces}`, name: 'approve', argumentsDelta: '{}' };
            await sleep(1);
          }
        } finally {
          closed++;
        }
      },
    };
    const agent = await createAgent({ model: calling, emergent: { enabled: true, judge: { model: calling, timeoutMs: 3000 } } });
    const started = Date.now();
    const res = await agent.forge(slugify, { sessionId: 's1' });
    assert.ok(!res.success && res.category === 'parse_error', JSON.stringify(res));
    assert.match(res.reason, /the judge answered with a tool call, not a verdict/);
    assert.ok(Date.now() - started < 1500, `the forge ended after ${Date.now() - started} ms`);
    assert.ok(pieces <= 2, `${pieces} pieces were read`);
    assert.equal(closed, 1, 'the stream was closed once the call came');
    await agent.close();
  });

  test("a judge that writes past what a verdict can be is told to stop through its signal, also when its iterator has no return()", async () => {
    let signal: AbortSignal | undefined;
    const endless: ModelProvider = {
      id: 'test-double:endless-judge',
      stream: (_request, options) => {
        signal = options?.signal;
        const next = async (): Promise<IteratorResult<ModelChunk>> => ({ done: false, value: { type: 'text', delta: 'x'.repeat(16 * 1024) } });
        return { [Symbol.asyncIterator]: () => ({ next }) };
      },
    };
    const agent = await createAgent({ model: endless, emergent: { enabled: true, judge: { model: endless } } });
    const res = await agent.forge(slugify, { sessionId: 's1' });
    assert.ok(!res.success, JSON.stringify(res));
    assert.equal(signal?.aborted, true, 'the provider was told to stop writing');
    await agent.close();
  });

  test('timeoutMs must be a whole number of milliseconds a timer can keep', async () => {
    const judge = judgeDouble();
    for (const timeoutMs of [0, -1, 1.5, '100', 2 ** 31, Number.NaN]) {
      for (const option of ['judge', 'promotionJudge'] as const) {
        await assert.rejects(
          createAgent({ model: judge.provider, emergent: { enabled: true, [option]: { model: judge.provider, timeoutMs } } as never }),
          { code: 'invalid_config', message: new RegExp(`emergent\\.${option}\\.timeoutMs must be a whole number of milliseconds`) },
        );
      }
    }
    const agent = await createAgent({ model: judge.provider, emergent: { enabled: true, judge: { model: judge.provider, timeoutMs: 2 ** 31 - 1 } } });
    assert.ok((await agent.forge(slugify)).success);
    await agent.close();
  });
});

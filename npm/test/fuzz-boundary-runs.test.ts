// Property tests of what reaches a run from outside: a model's output (a test-double provider
// streaming chunks of any shape, tool calls of any name and argument text, throws of any
// value) and `resume` given a mutated paused state and any approvals (the providers' wire
// streams: `fuzz-boundary-wire.test.ts`). After every case the run settled with a result or a typed
// error, and a known-good run (and, with emergent tools, the kept tools) still serve. A fixed
// seed by default; FC_SEED, FC_RUNS and FC_STATS=1 explore.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { createAgent, tool } from '../src/node.js';
import { anyInput, deeplyNested, forgeRequest, hostileString, hugeString, jsonish, jsonTextOf, loopingSchema, objectSchema, oddNumber, oddSchema, path, replacedAt } from './support/fuzz-arbitraries.js';
import {
  assertRunsServe, assertStillServing, assertTyped, check, emergentAgent, failOnUnhandledRejections, forgeKeptTools, label, ScriptedChatModel,
  settles, SHOUT_FORGE, Tally, upper, type ScriptStep,
} from './support/fuzz-harness.js';

failOnUnhandledRejections();

describe('generated model output', () => {
  test('a run survives whatever the model streams: odd chunks, tool calls of any name and argument text, throws', async () => {
    const model = new ScriptedChatModel();
    const agent = await emergentAgent(model);
    await forgeKeptTools(agent);
    const argumentsText = fc.oneof(
      fc.constantFrom('{"text":"hi"}', '{"a":1,"b":2}', '{"text":', '', '{}', 'null', '[]', '"text"', '{"text":"hi"}{"text":"again"}', '```json\n{"text":"hi"}\n```', '{"text":"\\ud800"}',
        '{"a":1e999,"b":-0}', '{"__proto__":{"text":1}}'),
      hostileString,
      // forge_tool's arguments among them.
      fc.oneof(anyInput, forgeRequest(SHOUT_FORGE as unknown as Record<string, unknown>)).map(jsonTextOf),
    );
    const callName = fc.oneof({ weight: 4, arbitrary: fc.constantFrom('upper', 'add', 'shout', 'slugify', 'forge_tool', 'nope', '') }, { weight: 1, arbitrary: hostileString });
    const toolCall = fc.record({
      index: fc.oneof({ weight: 12, arbitrary: fc.nat(3) }, { weight: 1, arbitrary: oddNumber }),
      id: fc.oneof(fc.constant(undefined), fc.constantFrom('call_1', 'call_1', ''), hostileString),
      name: fc.oneof(fc.constant(undefined), callName),
      argumentsText,
      pieces: fc.integer({ min: 1, max: 4 }),
    });
    // Steps a chunk or a few: a tool call comes in pieces, as providers stream it.
    const step: fc.Arbitrary<ScriptStep[]> = fc.oneof(
      { weight: 4, arbitrary: fc.oneof({ weight: 4, arbitrary: hostileString }, { weight: 1, arbitrary: hugeString }).map((delta) => [{ chunk: { type: 'text', delta } }]) },
      {
        weight: 14,
        arbitrary: toolCall.map(({ index, id, name, argumentsText: text, pieces }) => {
          const size = Math.ceil(text.length / pieces) || 1;
          return Array.from({ length: pieces }, (_, i) => ({ chunk: { type: 'tool_call', index, ...(i === 0 ? { id, name } : {}), argumentsDelta: text.slice(i * size, (i + 1) * size) } }));
        }),
      },
      {
        weight: 2,
        arbitrary: fc
          .record({ finishReason: fc.oneof(fc.constantFrom('stop', 'tool_calls', 'length', 'content_filter'), hostileString, jsonish), usage: fc.oneof(fc.constant(undefined), fc.record({ inputTokens: oddNumber, outputTokens: oddNumber }), jsonish) })
          .map((finish) => [{ chunk: { type: 'finish', ...finish } }]),
      },
      { weight: 1, arbitrary: anyInput.map((chunk) => [{ chunk }]) },
      { weight: 1, arbitrary: fc.record({ type: fc.constantFrom('text', 'tool_call', 'finish', 'bogus'), delta: anyInput, index: anyInput, name: anyInput, argumentsDelta: anyInput, finishReason: anyInput }, { requiredKeys: ['type'] }).map((chunk) => [{ chunk }]) },
      {
        weight: 1,
        arbitrary: fc.oneof(anyInput, fc.constantFrom<unknown>(new Error('boom'), Object.assign(new Error('coded'), { code: 'not_a_code' }), { code: 'provider_http', status: 1e9, message: 5 }, { code: 'aborted' }))
          .map((thrown) => [{ throws: thrown }]),
      },
    );
    const input = fc.oneof({ weight: 12, arbitrary: fc.constant<unknown>('go') }, { weight: 1, arbitrary: anyInput });
    const options = fc.oneof({ weight: 12, arbitrary: fc.constant<unknown>({ sessionId: 'fz' }) }, { weight: 1, arbitrary: anyInput });
    const outcomes = new Tally('run outcomes');
    await check(
      fc.asyncProperty(fc.array(step, { minLength: 1, maxLength: 6 }), input, options, async (steps, text, given) => {
        model.play(steps.flat());
        const run = await settles(() => agent.run(text as string, given as never), 'agent.run');
        if (!run.ok) assertTyped(run.error, 'agent.run');
        outcomes.add(run.ok ? run.value.status : label(run.error, 110));
        await agent.endSession('fz');
        await assertRunsServe(agent, model, 'after a generated answer');
        await assertStillServing(agent, 'after a generated answer');
      }),
      150,
    );
    outcomes.report();
    await agent.close();
  });

  test('a returns schema of any shape, an answer of any text and a host tool result of any value end a run with a result or a typed error', async () => {
    const model = new ScriptedChatModel();
    // What the host tool returns next: any value, huge, deep, without a JSON form, or a promise.
    let produced: unknown;
    const produce = tool({ name: 'produce', description: 'Returns a value', inputSchema: { type: 'object', properties: {} }, execute: () => produced });
    const returns = fc.oneof({ weight: 4, arbitrary: objectSchema }, { weight: 1, arbitrary: oddSchema }, { weight: 1, arbitrary: loopingSchema });
    const answer = fc.oneof(
      { weight: 3, arbitrary: fc.oneof(jsonish, fc.record({ text: hostileString }), fc.record({ text: fc.constantFrom('a'.repeat(40) + 'b', 'aaaa', '') })).map(jsonTextOf) },
      { weight: 1, arbitrary: fc.oneof(hostileString, hugeString) },
      { weight: 1, arbitrary: fc.oneof(jsonish, deeplyNested).map((v) => '```json\n' + jsonTextOf(v) + '\n```') },
    );
    const result = fc.oneof({ weight: 3, arbitrary: anyInput }, { weight: 1, arbitrary: hugeString.map((text) => ({ text })) }, { weight: 1, arbitrary: deeplyNested.map((v) => Promise.resolve(v)) });
    const outcomes = new Tally('returns outcomes');
    await check(
      fc.asyncProperty(returns, result, answer, async (schema, value, text) => {
        const created = await settles(() => createAgent({ model, tools: [produce], returns: schema as never, maxTurns: 3, maxOutputRetries: 1 }), 'createAgent with returns');
        if (!created.ok) {
          assertTyped(created.error, 'createAgent with returns');
          outcomes.add(label(created.error, 70));
          return;
        }
        const agent = created.value;
        try {
          produced = value;
          // The call, then the generated answer, twice (once more when it is asked again).
          const said: ScriptStep[] = [{ chunk: { type: 'text', delta: text } }, { chunk: { type: 'finish', finishReason: 'stop' } }];
          model.play([{ chunk: { type: 'tool_call', index: 0, id: 'call_p', name: 'produce', argumentsDelta: '{}' } }, { chunk: { type: 'finish', finishReason: 'tool_calls' } }], said, said);
          const run = await settles(() => agent.run('go'), 'a run with returns');
          if (!run.ok) assertTyped(run.error, 'a run with returns');
          outcomes.add(run.ok ? run.value.status : label(run.error, 70));
        } finally {
          await agent.close();
        }
      }),
      150,
    );
    outcomes.report();
  });

  test('resume answers a mutated paused state and any approvals with a result or a typed error', async () => {
    const model = new ScriptedChatModel();
    const refund = tool({
      name: 'refund',
      description: 'Refunds an order',
      inputSchema: { type: 'object', properties: { order: { type: 'number' } }, required: ['order'] },
      needsApproval: true,
      execute: ({ order }: { order: number }) => ({ refunded: order }),
    });
    // Without a store: the state object is what runs.
    const agent = await createAgent({ model, tools: [refund, upper], maxTurns: 4 });
    const pause = async () => {
      model.play([{ chunk: { type: 'tool_call', index: 0, id: 'call_r', name: 'refund', argumentsDelta: '{"order":42}' } }, { chunk: { type: 'finish', finishReason: 'tool_calls' } }]);
      const run = await agent.run('refund 42', { sessionId: 'fz' });
      assert.equal(run.status, 'paused');
      return run as Extract<typeof run, { status: 'paused' }>;
    };
    const paused = await pause();
    const approvalId = paused.pendingApprovals[0]!.id;
    const odd = fc.oneof(jsonish, oddNumber, fc.constantFrom<unknown>(null, [], {}, '', -1, 4294967295, 4294967296, 2 ** 53, 'call_r', approvalId, 'refund', 'nope'));
    const state = fc.oneof(
      { weight: 2, arbitrary: fc.constant<unknown>(paused.state) },
      { weight: 6, arbitrary: fc.array(fc.tuple(path, odd), { minLength: 1, maxLength: 2 }).map((edits) => edits.reduce((st, [steps, value]) => replacedAt(st, steps, value), paused.state as unknown)) },
      { weight: 1, arbitrary: anyInput },
    );
    const decision = fc.record(
      {
        id: fc.oneof({ weight: 6, arbitrary: fc.constant<unknown>(approvalId) }, { weight: 1, arbitrary: hostileString }, { weight: 1, arbitrary: anyInput }),
        approved: fc.oneof({ weight: 6, arbitrary: fc.boolean() }, { weight: 1, arbitrary: anyInput }),
        reason: fc.oneof({ weight: 4, arbitrary: fc.constant(undefined) }, { weight: 2, arbitrary: hostileString }, { weight: 1, arbitrary: anyInput }),
      },
      { requiredKeys: ['id', 'approved'] },
    );
    const approvals = fc.oneof({ weight: 6, arbitrary: fc.array(decision, { maxLength: 3 }) }, { weight: 1, arbitrary: anyInput });
    const runId = fc.oneof({ weight: 6, arbitrary: fc.constant<unknown>(paused.runId) }, { weight: 1, arbitrary: hostileString });
    const outcomes = new Tally('resume outcomes');
    await check(
      fc.asyncProperty(runId, state, approvals, async (id, st, decisions) => {
        model.plain();
        const resumed = await settles(() => agent.resume({ runId: id as string, state: st }, { approvals: decisions as never }), 'agent.resume');
        if (!resumed.ok) assertTyped(resumed.error, 'agent.resume');
        outcomes.add(resumed.ok ? resumed.value.status : label(resumed.error, 70));
        await agent.endSession('fz');
        await assertRunsServe(agent, model, 'after a generated resume');
      }),
      800,
    );
    outcomes.report();
    // A run paused now still resumes as it should.
    const fresh = await pause();
    model.plain();
    const done = await agent.resume(fresh, { approvals: [{ id: fresh.pendingApprovals[0]!.id, approved: true }] });
    assert.equal(done.status === 'completed' && done.text, 'fine');
    await agent.close();
  });
});

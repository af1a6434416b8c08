// The public agent API end to end in Node: the wasm core, real fetch providers, and the mock
// LLM server (a test double speaking the real wire formats over HTTP).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { z } from 'zod';
import { type } from 'arktype';
import { AbortError, AgentRunError, CrucibleError, createAgent, memoryStore, type CrucibleErrorCode, type Store, openai, anthropic, ProviderError, tool, type AgentEvent, type ChatMessage, type ModelProvider } from '../src/node.js';
import { collectGarbage, coreMemoryBytes, functionsHeldByCore } from './support/core-internals.js';
import { allEvents as collect } from './support/events.js';
import { startMockLlmServer, type MockLlmServer } from './support/mock-llm-server.js';

let server: MockLlmServer;
before(async () => {
  server = await startMockLlmServer({ replies: [] });
});
after(() => server.close());

const weatherCalls: string[] = [];
const weather = tool({
  name: 'get_weather',
  description: 'Current temperature for a city',
  inputSchema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  execute: async ({ city }: { city: string }) => {
    weatherCalls.push(city);
    return { city, celsius: 21 };
  },
});

function model() {
  return openai({ baseURL: server.openaiBaseURL, apiKey: 'none', model: 'qwen', retry: { maxRetries: 0 } });
}

describe('agent over an OpenAI-compatible server', () => {
  test('streams typed events through a tool call to the final answer', async () => {
    server.reset();
    server.enqueue({ toolCalls: [{ name: 'get_weather', arguments: { city: 'Oslo' } }] }, { text: 'It is 21 degrees in Oslo.' });
    const agent = await createAgent({ model: model(), instructions: 'You are concise.', tools: [weather] });
    const events = await collect(agent.stream('What is the weather in Oslo?'));
    const types = events.map((e) => e.type).filter((t) => t !== 'text.delta');
    assert.deepEqual(types, ['agent.start', 'step.start', 'tool.call', 'tool.execute.start', 'tool.execute.end', 'step.end', 'step.start', 'step.end', 'agent.end']);
    const text = events.flatMap((e) => (e.type === 'text.delta' ? [e.delta] : [])).join('');
    assert.equal(text, 'It is 21 degrees in Oslo.');
    const end = events.find((e) => e.type === 'tool.execute.end');
    assert.ok(end && end.type === 'tool.execute.end');
    assert.deepEqual(end.result, { city: 'Oslo', celsius: 21 });
    const runIds = new Set(events.map((e) => e.runId));
    assert.equal(runIds.size, 1);
    assert.deepEqual(events[0]!.runPath, [events[0]!.runId]);
    // The second request carried the tool result back, with the system prompt first.
    const second = server.requests[1]!;
    assert.equal(second.messages[0]!.role, 'system');
    assert.equal(second.messages.at(-1)!.role, 'tool');
    assert.match(second.messages.at(-1)!.content, /"celsius":21/);
  });

  test('toolChoice reaches the wire on the first turn and lets go after the first tool call', async () => {
    server.reset();
    server.enqueue({ toolCalls: [{ name: 'get_weather', arguments: { city: 'Oslo' } }] }, { text: 'It is 21 degrees in Oslo.' });
    const agent = await createAgent({ model: model(), tools: [weather], toolChoice: { tool: 'get_weather' } });
    const result = await agent.run('What is the weather in Oslo?');
    assert.equal(result.text, 'It is 21 degrees in Oslo.');
    const choices = server.requests.map((r) => (r.body as Record<string, unknown>).tool_choice);
    assert.deepEqual(choices, [{ type: 'function', function: { name: 'get_weather' } }, undefined]);

    // A tool the agent does not have: a typed error before any model call.
    server.reset();
    const wrong = await createAgent({ model: model(), tools: [weather], toolChoice: { tool: 'nope' } });
    await assert.rejects(wrong.run('hi'), (e: AgentRunError) => e.code === 'invalid_config' && /nope/.test(e.message));
    assert.equal(server.requests.length, 0);

    // `required` on an agent with no tools could not be obeyed: the same, not a silent answer.
    const toolless = await createAgent({ model: model(), toolChoice: 'required' });
    await assert.rejects(toolless.run('hi'), (e: AgentRunError) => e.code === 'invalid_config' && /has no tools/.test(e.message));
    assert.equal(server.requests.length, 0);
  });

  test('an agentId that cannot name its records is invalid_config', async () => {
    // With a `/`, agent "a" would read agent "a/tool"'s records as its own tools.
    // A lone surrogate would read as U+FFFD in the core: 'x\uD800' and 'x\uDC00' would share records.
    for (const agentId of ['a/tool', '', 'x'.repeat(129), 'x\uD800', 'x\uDC00']) {
      await assert.rejects(createAgent({ model: model(), agentId }), { code: 'invalid_config', message: /agentId/ });
    }
    const fine = await createAgent({ model: model(), agentId: 'support-bot.eu-1' });
    await fine.close();
  });

  test('a tool schema nested past what the core reads says so, not serde\'s recursion limit at a column', async () => {
    let schema: Record<string, unknown> = { type: 'string' };
    for (let i = 0; i < 70; i++) schema = { type: 'object', properties: { x: schema } };
    const deep = tool({ name: 'deep', description: 'd', inputSchema: schema, execute: () => 'ok' });
    await assert.rejects(createAgent({ model: model(), tools: [deep] }), { code: 'invalid_config', message: /^tools: nests arrays and objects more than 127 levels deep \(as JSON\)/ });
  });

  test('a sessionId with a lone surrogate is refused wherever a session is named: it would share a session with another', async () => {
    server.reset();
    server.enqueue({ text: 'Noted.' }, { text: 'Fine.' });
    const agent = await createAgent({ model: model(), emergent: { enabled: true } });
    // Two users' names cut inside an emoji: the core would read both as "u-\uFFFD".
    const [first, second] = ['u-\uD83D', 'u-\uDE00'];
    await assert.rejects(agent.run('my password is hunter2', { sessionId: first }), { code: 'invalid_config', message: /sessionId "u-\\ud83d" has a lone UTF-16 surrogate/ });
    await assert.rejects(collect(agent.stream('hi', { sessionId: second })), { code: 'invalid_config' });
    assert.throws(() => agent.history(second), { code: 'invalid_argument', message: /history: sessionId/ });
    await assert.rejects(agent.endSession(first), { code: 'invalid_argument' });
    assert.throws(() => agent.tools.list({ sessionId: first }), { code: 'invalid_argument' });
    await assert.rejects(agent.forge({ name: 'x' }, { sessionId: first }), { code: 'invalid_argument' });
    assert.equal(server.requests.length, 0);
    // A whole pair, and U+FFFD itself, name sessions of their own.
    assert.equal((await agent.run('hi', { sessionId: 'u-😀' })).text, 'Noted.');
    assert.deepEqual(agent.history('u-\uFFFD'), []);
    assert.equal(agent.history('u-😀').length, 2);
    await agent.close();
  });

  test('two tools whose names differ only in case or - vs _ are invalid_config: a model takes them for one', async () => {
    for (const [a, b] of [['refund', 'Refund'], ['send_email', 'send-email'], ['get-user', 'GET_USER']] as const) {
      const tools = [a, b].map((name) => tool({ name, description: name, inputSchema: { type: 'object' }, execute: () => name }));
      await assert.rejects(createAgent({ model: model(), tools }), { code: 'invalid_config', message: `tools \`${a}\` and \`${b}\` differ only in case or \`-\` vs \`_\`: a model takes them for one tool` });
    }
  });

  test('an error has a cause only when it was given one', () => {
    assert.equal('cause' in new CrucibleError('internal', 'm'), false);
    const root = new Error('root');
    assert.equal(new AbortError('m', { cause: root }).cause, root);
  });

  test('bad arguments are typed errors, not TypeErrors from the bindings', async () => {
    const code = (c: string) => (e: unknown) => (e as { code?: string }).code === c;
    await assert.rejects(createAgent({ model: model(), tools: [{ ...weather, needsApproval: 'always' as unknown as boolean }] }), code('invalid_config'), 'needsApproval that would mean "never" fails closed');
    await assert.rejects(createAgent({ model: model(), tools: weather as unknown as [] }), code('invalid_config'));
    await assert.rejects(createAgent({ model: model(), store: 'db' as never }), code('invalid_config'));
    await assert.rejects(createAgent({ model: model(), emergent: { enabled: true, judge: model() as never } }), code('invalid_config'));
    for (const settings of [{ temperature: Number.NaN }, { temperature: -1 }, { maxTokens: 0 }, { maxTokens: Infinity }, { maxTurns: Number.NaN }]) {
      await assert.rejects(createAgent({ model: model(), ...settings }), code('invalid_config'), JSON.stringify(settings));
    }
    const agent = await createAgent({ model: model(), tools: [weather] });
    await assert.rejects(agent.run(123 as unknown as string), code('invalid_config'));
    await assert.rejects(agent.run(undefined as unknown as string), code('invalid_config'));
    await assert.rejects(agent.resume(null as never), code('invalid_config'));
    for (const signal of ['nope', {}, null]) {
      await assert.rejects(agent.run('hi', { signal: signal as never }), code('invalid_config'), `run signal ${String(signal)}`);
      await assert.rejects(agent.resume('run_x', { signal: signal as never }), code('invalid_config'), `resume signal ${String(signal)}`);
    }
    await agent.close();
  });

  test('an option of the wrong type or range is invalid_config naming the option, not a position in JSON the caller never wrote', async () => {
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ maxTurns: 'ten' }, /createAgent: maxTurns must be a whole number from 1 to 4294967295, got "ten"/],
      [{ maxParallelTools: 0 }, /createAgent: maxParallelTools must be a whole number from 1 to 4294967295, got 0/],
      [{ maxSteps: -3 }, /createAgent: maxSteps .* got -3/],
      [{ maxTokens: 1.5 }, /createAgent: maxTokens .* got 1\.5/],
      [{ maxParallelTools: 2 ** 32 }, /createAgent: maxParallelTools /],
      [{ maxResultBytes: '64k' }, /createAgent: maxResultBytes /],
      [{ maxOutputRetries: -1 }, /createAgent: maxOutputRetries /],
      [{ temperature: '0.5' }, /createAgent: temperature must be a finite number, got "0\.5"/],
      [{ resetToolChoice: 'yes' }, /createAgent: resetToolChoice must be true or false, got "yes"/],
      [{ instructions: 5 }, /createAgent: instructions must be a string, got number/],
      [{ agentId: 5 }, /createAgent: agentId must be a string, got number/],
      [{ emergent: { enabled: true, maxSessionTools: -1 } }, /createAgent: emergent\.maxSessionTools /],
      [{ emergent: { enabled: true, statsFlushEvery: 1.5 } }, /createAgent: emergent\.statsFlushEvery /],
      [{ emergent: { enabled: true, autoPromote: 'no' } }, /createAgent: emergent\.autoPromote must be true or false/],
      [{ emergent: { enabled: 'yes' } }, /createAgent: emergent\.enabled must be true or false/],
      [{ emergent: { enabled: true, promotionThreshold: { uses: -1 } } }, /createAgent: emergent\.promotionThreshold\.uses /],
      [{ emergent: { enabled: true, promotionThreshold: { confidence: Number.NaN } } }, /createAgent: emergent\.promotionThreshold\.confidence must be a finite number, got NaN/],
      // A confidence above 1 was taken, and no tool was ever promoted.
      [{ emergent: { enabled: true, promotionThreshold: { confidence: 1.5 } } }, /createAgent: emergent\.promotionThreshold\.confidence must be from 0 to 1, got 1\.5/],
      [{ emergent: { enabled: true, promotionThreshold: 5 } }, /createAgent: emergent\.promotionThreshold must be an object \{ uses, confidence \}, got number/],
      // A misspelt threshold was ignored, and the tool promoted at the default 5 uses.
      [{ emergent: { enabled: true, promotionThreshold: { usez: 3 } } }, /createAgent: emergent\.promotionThreshold: unknown option usez/],
      // `emergent: true` read as "enable it" was an agent without forge_tool, without a word.
      [{ emergent: true }, /createAgent: emergent must be an object such as \{ enabled: true \}, got boolean/],
      [{ emergent: [] }, /createAgent: emergent must be an object .*got an array/],
      [{ emergent: { enabled: true, sandbox: 5 } }, /createAgent: emergent\.sandbox must be a sandbox such as await createSandbox\(\), got number/],
    ];
    for (const [settings, message] of cases) {
      await assert.rejects(createAgent({ model: model(), ...settings } as never), (e: unknown) => {
        assert.ok(e instanceof CrucibleError, String(e));
        assert.equal(e.code, 'invalid_config');
        assert.match(e.message, message);
        assert.doesNotMatch(e.message, /line \d+ column \d+/);
        return true;
      }, JSON.stringify(settings));
    }
    // Absent-by-null settings and the ranges the core checks are as before.
    await assert.rejects(createAgent({ model: model(), maxTurns: 0 }), { code: 'invalid_config', message: /maxTurns must be a whole number from 1 to 4294967295, got 0/ });
    const fine = await createAgent({ model: model(), maxSteps: 0, maxTokens: null as never, instructions: null as never, emergent: null as never });
    await fine.close();
  });

  test('a listener that fails, synchronously or in a promise it returns, neither breaks the run nor reaches the process as an unhandled rejection', async () => {
    const unhandled: unknown[] = [];
    const record = (reason: unknown) => unhandled.push(reason);
    process.on('unhandledRejection', record);
    try {
      server.reset();
      server.enqueue({ text: 'fine' });
      const agent = await createAgent({ model: model() });
      const heard: string[] = [];
      agent.on(() => {
        throw new Error('sync listener failed');
      });
      // An async listener is a `(event) => void` too; before, its rejection ended a Node
      // service (unhandled rejections throw there by default).
      agent.on(async (e) => {
        if (e.type === 'agent.end') throw new Error('async listener failed');
      });
      agent.on((e) => void heard.push(e.type));
      assert.equal((await agent.run('?')).output, 'fine');
      await new Promise((resolve) => setTimeout(resolve, 50));
      assert.deepEqual(unhandled, []);
      assert.equal(heard.at(-1), 'agent.end', 'the listener after the failing ones heard every event');
      await agent.close();
    } finally {
      process.off('unhandledRejection', record);
    }
  });

  test("return() on a stream whose next() still waits on a stalled model aborts the run at once, not at the model's next chunk", { timeout: 30_000 }, async () => {
    let seenSignal: AbortSignal | undefined;
    const stalling: ModelProvider = {
      id: 'double:stalling',
      async *stream(_request, options) {
        seenSignal = options?.signal;
        yield { type: 'text', delta: 'Thinking' };
        // Ignores its signal: stalls for 5 s whatever happens.
        await new Promise((resolve) => setTimeout(resolve, 5000));
        yield { type: 'text', delta: '… done.' };
        yield { type: 'finish', finishReason: 'stop' };
      },
    };
    const agent = await createAgent({ model: stalling });
    const events = agent.stream('hi');
    for (let e = await events.next(); !e.done && e.value.type !== 'text.delta'; e = await events.next());
    // The usual per-event timeout: race next() against a timer, then give up on the stream.
    const pending = events.next();
    const timedOut = await Promise.race([pending.then(() => false), new Promise<boolean>((resolve) => setTimeout(() => resolve(true), 100))]);
    assert.ok(timedOut, 'the model stalled');
    const started = performance.now();
    await events.return(undefined);
    const took = performance.now() - started;
    // Before: 4.9 s, until the stalled model's next chunk.
    assert.ok(took < 1000, `return() took ${took.toFixed(0)} ms`);
    assert.equal(seenSignal?.aborted, true, "the provider's signal is aborted");
    await pending.catch(() => undefined);
    await agent.close();
  });

  test('run() says an answer cut off at the token limit ended so', async () => {
    server.reset();
    server.enqueue({ text: 'an answer cut mid-sen', finishReason: 'length' }, { text: 'whole.' });
    const agent = await createAgent({ model: model() });
    const cut = await agent.run<string>('?');
    // Checked by `npm run typecheck:tests` (before any assertion narrows `cut`): the status
    // tells a run's shape apart.
    if (cut.status === 'completed') void cut.output.length;
    // @ts-expect-error a paused run has no output
    else void cut.output.length;
    assert.equal(cut.status, 'completed');
    assert.equal(cut.finishReason, 'length');
    assert.equal((await agent.run('?')).finishReason, 'stop');
    await agent.close();
  });

  test('run() collects the stream and continues the session conversation', async () => {
    server.reset();
    server.enqueue({ text: 'Sunny.', usage: { inputTokens: 7, outputTokens: 2 } }, { text: 'Rainy.', usage: { inputTokens: 9, outputTokens: 3 } });
    const agent = await createAgent({ model: model(), tools: [weather] });
    await agent.run('Weather in Oslo?');
    const { output, usage } = await agent.run('And in Lima?', { signal: AbortSignal.timeout(60_000) });
    assert.equal(output, 'Rainy.');
    assert.equal(usage.inputTokens, 9);
    assert.deepEqual(usage.byModel['openai:qwen'], { inputTokens: 9, outputTokens: 3 });
    const users = server.requests[1]!.messages.filter((m) => m.role === 'user').map((m) => m.content);
    assert.deepEqual(users, ['Weather in Oslo?', 'And in Lima?']);
  });

  test('invalid arguments and throwing tools become error results; the loop goes on', async () => {
    server.reset();
    const failing = tool({
      name: 'flaky',
      description: 'always fails',
      inputSchema: { type: 'object', properties: {} },
      execute: () => {
        throw new Error('backend exploded');
      },
    });
    server.enqueue(
      { toolCalls: [{ name: 'get_weather', arguments: { town: 'Oslo' } }, { name: 'flaky', arguments: {} }, { name: 'nope', arguments: {} }] },
      { text: 'Sorry.' },
    );
    weatherCalls.length = 0;
    const agent = await createAgent({ model: model(), tools: [weather, failing] });
    const events = await collect(agent.stream('?'));
    const errors = events.flatMap((e) => (e.type === 'tool.execute.error' ? [e.error] : []));
    assert.deepEqual(errors.map((e) => e.code), ['invalid_arguments', 'execution_failed', 'unknown_tool']);
    assert.match(errors[1]!.message, /backend exploded/);
    assert.equal(weatherCalls.length, 0);
    assert.equal(events.at(-1)!.type, 'agent.end');
  });


  test('a tool result with no JSON form is an error result; sync and async results both arrive', async () => {
    server.reset();
    // `deep`: past JSON.stringify's own depth, whose RangeError reads like a stack overflow.
    const deep = (() => { let v: unknown = 1; for (let i = 0; i < 20_000; i++) v = [v]; return v; })();
    const results: Record<string, unknown> = { sync: { ok: 1 }, bigint: { n: 10n }, fn: () => 1, cyclic: (() => { const o: Record<string, unknown> = {}; o.self = o; return o; })(), deep };
    const make = (name: string, isAsync: boolean) =>
      tool({ name, description: name, inputSchema: { type: 'object', properties: {} }, execute: isAsync ? async () => results[name] : () => results[name] });
    server.enqueue(
      { toolCalls: [{ name: 'sync', arguments: {} }, { name: 'bigint', arguments: {} }, { name: 'fn', arguments: {} }, { name: 'cyclic', arguments: {} }, { name: 'deep', arguments: {} }, { name: 'weather_async', arguments: {} }] },
      { text: 'Done.' },
    );
    const agent = await createAgent({
      model: model(),
      tools: [make('sync', false), make('bigint', true), make('fn', false), make('cyclic', false), make('deep', true), tool({ name: 'weather_async', description: 'w', inputSchema: { type: 'object', properties: {} }, execute: async () => ({ celsius: 21 }) })],
    });
    const events = await collect(agent.stream('?'));
    const outcome = Object.fromEntries(
      events.flatMap((e) => (e.type === 'tool.execute.end' ? [[e.name, e.result]] : e.type === 'tool.execute.error' ? [[e.name, e.error.code]] : [])),
    );
    assert.deepEqual(outcome, { sync: { ok: 1 }, bigint: 'execution_failed', fn: 'execution_failed', cyclic: 'execution_failed', deep: 'execution_failed', weather_async: { celsius: 21 } });
    const deepError = events.find((e) => e.type === 'tool.execute.error' && e.name === 'deep');
    assert.ok(deepError?.type === 'tool.execute.error' && /nests too deeply to be written as JSON/.test(deepError.error.message) && !/call stack/i.test(deepError.error.message), JSON.stringify(deepError));
    assert.equal(events.at(-1)!.type, 'agent.end');
  });
  test('text cut inside an emoji (a lone UTF-16 surrogate) arrives with U+FFFD in its place: from a tool, and from a provider that never sends the other half', async () => {
    server.reset();
    server.enqueue({ toolCalls: [{ name: 'excerpt', arguments: {} }] }, { text: 'Done.' });
    // "Hi 🌍".slice(0, 4): the emoji's first half only.
    const excerpt = tool({ name: 'excerpt', description: 'e', inputSchema: { type: 'object', properties: {} }, execute: () => ({ text: 'Hi 🌍'.slice(0, 4) }) });
    const agent = await createAgent({ model: model(), tools: [excerpt] });
    const events = await collect(agent.stream('?'));
    const end = events.find((e) => e.type === 'tool.execute.end');
    assert.deepEqual(end?.type === 'tool.execute.end' && end.result, { text: 'Hi \ufffd' }, JSON.stringify(events.filter((e) => e.type.startsWith('tool.'))));
    assert.match(server.requests.at(-1)!.messages.at(-1)!.content ?? '', /Hi \ufffd/);

    // A half nothing continues, at the end of the answer and before a tool call.
    const [high, low] = ['🌍'.slice(0, 1), '🌍'.slice(1)];
    const cut: ModelProvider = {
      id: 'double:cut',
      async *stream() {
        yield { type: 'text', delta: `Hello ${high}` };
        yield { type: 'text', delta: `${low}${low}!${high}` };
        yield { type: 'finish', finishReason: 'stop' };
      },
    };
    const answer = await (await createAgent({ model: cut })).run('hi');
    assert.equal(answer.status, 'completed');
    assert.equal(answer.text, 'Hello 🌍\ufffd!\ufffd');
  });

  test('an emoji split between two deltas arrives whole: in text and in tool-call arguments, from a provider of one\'s own and over SSE', async () => {
    const [high, low] = ['🌍'.slice(0, 1), '🌍'.slice(1)];
    const seen: unknown[] = [];
    const echo = tool({ name: 'echo', description: 'e', inputSchema: { type: 'object', properties: { s: { type: 'string' } } }, execute: (args) => (seen.push(args), 'ok') });
    // A provider of one's own that streams by UTF-16 code units, a call's arguments too.
    let turn = 0;
    const splitting: ModelProvider = {
      id: 'double:splitting',
      async *stream() {
        if (turn++ === 0) {
          yield { type: 'text', delta: `Calling ${high}` };
          yield { type: 'tool_call', index: 0, id: 'c1', name: 'echo', argumentsDelta: `{"s":"party ${high}` };
          yield { type: 'text', delta: `${low}.` };
          yield { type: 'tool_call', index: 0, argumentsDelta: `${low} ${high}` };
          yield { type: 'tool_call', index: 0, argumentsDelta: `${low}"}` };
          yield { type: 'finish', finishReason: 'tool_calls' };
        } else {
          yield { type: 'text', delta: high };
          yield { type: 'text', delta: `${low}!` };
          yield { type: 'finish', finishReason: 'stop' };
        }
      },
    };
    const agent = await createAgent({ model: splitting, tools: [echo] });
    const events = await collect(agent.stream('hi'));
    assert.deepEqual(seen, [{ s: 'party 🌍 🌍' }]);
    const deltas = events.filter((e) => e.type === 'text.delta').map((e) => e.type === 'text.delta' && e.delta).join('');
    assert.equal(deltas, 'Calling 🌍.🌍!');
    assert.equal(events.at(-1)!.type, 'agent.end');
    // A half that ends a call whose index the next call shares (servers numbering every call 0)
    // stays with its call: the next call's arguments are its own.
    seen.length = 0;
    const sameIndex: ModelProvider = {
      id: 'double:same-index',
      async *stream() {
        if (turn++ === 2) {
          yield { type: 'tool_call', index: 0, id: 'a', name: 'echo', argumentsDelta: `{"s":"x${high}` };
          yield { type: 'tool_call', index: 0, id: 'b', name: 'echo', argumentsDelta: '{"s":"y"}' };
          yield { type: 'finish', finishReason: 'tool_calls' };
        } else {
          yield { type: 'text', delta: 'ok' };
          yield { type: 'finish', finishReason: 'stop' };
        }
      },
    };
    const calls = await collect((await createAgent({ model: sameIndex, tools: [echo] })).stream('hi'));
    assert.deepEqual(calls.flatMap((e) => (e.type === 'tool.execute.error' ? [e.callId] : [])), ['a'], 'the cut call fails as cut (its string never closes)');
    assert.deepEqual(seen, [{ s: 'y' }], 'the next call is whole');
    // Over SSE, each half written as its own escape in its own event (what JSON.stringify writes).
    server.reset();
    server.enqueue({ text: ['Hi ', high, `${low}!`] });
    assert.equal((await (await createAgent({ model: model() })).run('hi')).text, 'Hi 🌍!');
  });

  test('an input past the 16 Mi-character ceiling is refused before it enters the core, and the agent keeps serving', async () => {
    server.reset();
    server.enqueue({ text: 'Small one.' });
    const agent = await createAgent({ model: model() });
    const before = coreMemoryBytes();
    // 400 M characters ran out of JS string length inside the core: an uncaught throw from a
    // microtask ended the process. 17 Mi is enough to cross the ceiling.
    const huge = 'é'.repeat(17 * 2 ** 20);
    await assert.rejects(agent.run(huge), (e: unknown) => e instanceof CrucibleError && e.code === 'invalid_argument' && /input is 17825792 characters; at most 16777216 are read/.test(e.message));
    await assert.rejects(collect(agent.stream(huge)), { code: 'invalid_argument' });
    const grown = coreMemoryBytes() - before;
    assert.ok(grown < 16 * 2 ** 20, `the core's memory grew by ${(grown / 2 ** 20).toFixed(0)} MiB for good`);
    assert.equal(server.requests.length, 0, 'the model was not asked');
    assert.equal((await agent.run('small')).text, 'Small one.');
    await agent.close();
  });

  test('token counts that are not whole (a fraction, past 2^64) are read as whole counts; the answer is kept', async () => {
    const counts: ModelProvider = {
      id: 'double:odd-counts',
      async *stream() {
        yield { type: 'text', delta: 'Hi' };
        yield { type: 'finish', finishReason: 'stop', usage: { inputTokens: 12.5, outputTokens: 1e20 } };
      },
    };
    const agent = await createAgent({ model: counts });
    const result = await agent.run('hello');
    assert.equal(result.text, 'Hi');
    assert.equal(result.usage.inputTokens, 12);
    assert.equal(result.usage.outputTokens, 2 ** 64, 'saturated at the largest count (2^64 - 1, as a JS number)');
    await agent.close();
  });

  test("a value the engine cannot read back (JSON.parse throwing, as past JS's longest string) is a typed error, and the agent keeps serving", { timeout: 30_000 }, async () => {
    // Reaching V8's longest string for real takes a run of many 16 Mi tool results and ~1 GB;
    // the engine's throw is what matters, so JSON.parse throws here for a long text instead.
    const answer = 'y'.repeat(2 ** 21);
    const long: ModelProvider = {
      id: 'double:long-answer',
      async *stream() {
        yield { type: 'text', delta: answer };
        yield { type: 'finish', finishReason: 'stop' };
      },
    };
    const agent = await createAgent({ model: long });
    const parse = JSON.parse;
    JSON.parse = (text: string, reviver?: Parameters<typeof parse>[1]) => {
      if (typeof text === 'string' && text.length > 2 ** 21) throw new RangeError('Invalid string length');
      return parse(text, reviver);
    };
    try {
      await assert.rejects(agent.run('long'), (e: unknown) => e instanceof CrucibleError && e.code === 'internal' && /could not read a value of \d+ bytes of JSON: Invalid string length/.test(e.message));
    } finally {
      JSON.parse = parse;
    }
    assert.equal((await agent.run('again')).text, answer);
    await agent.close();
  });

  test('a host tool result past the 16 Mi-character ceiling is refused before it enters the core; the run goes on', async () => {
    server.reset();
    server.enqueue({ toolCalls: [{ name: 'dump', arguments: {} }, { name: 'get_weather', arguments: { city: 'Oslo' } }] }, { text: 'Done.' });
    const dump = tool({ name: 'dump', description: 'd', inputSchema: { type: 'object', properties: {} }, execute: () => ({ blob: 'x'.repeat(17 * 2 ** 20) }) });
    const agent = await createAgent({ model: model(), tools: [dump, weather], maxResultBytes: 64 * 2 ** 20 });
    const events = await collect(agent.stream('?'));
    const error = events.find((e) => e.type === 'tool.execute.error');
    assert.ok(error?.type === 'tool.execute.error' && error.name === 'dump', JSON.stringify(error).slice(0, 300));
    assert.equal(error.error.code, 'result_too_large');
    assert.match(error.error.message, /the most a host tool may return is 16777216/);
    assert.ok(events.some((e) => e.type === 'tool.execute.end' && e.name === 'get_weather'));
    assert.equal(events.at(-1)!.type, 'agent.end');
  });

  test('a host tool result nested past what the core reads is said as depth, not as malformed JSON; the run goes on', async () => {
    server.reset();
    server.enqueue({ toolCalls: [{ name: 'deep', arguments: {} }, { name: 'get_weather', arguments: { city: 'Oslo' } }] }, { text: 'Done.' });
    let nested: unknown = 1;
    for (let i = 0; i < 200; i++) nested = [nested];
    const deep = tool({ name: 'deep', description: 'd', inputSchema: { type: 'object', properties: {} }, execute: () => ({ nested }) });
    const agent = await createAgent({ model: model(), tools: [deep, weather] });
    const events = await collect(agent.stream('?'));
    const error = events.find((e) => e.type === 'tool.execute.error');
    assert.ok(error?.type === 'tool.execute.error' && error.name === 'deep', JSON.stringify(error).slice(0, 300));
    assert.equal(error.error.code, 'execution_failed');
    assert.equal(error.error.message, "the tool's result nests arrays and objects more than 127 levels deep");
    assert.ok(events.some((e) => e.type === 'tool.execute.end' && e.name === 'get_weather'));
    assert.equal(events.at(-1)!.type, 'agent.end');
    await agent.close();
  });

  test("a provider of one's own giving a call's providerData last, by id, among calls sharing an index, gets it back on that call and no made-up call runs", async () => {
    const requests: ChatMessage[][] = [];
    const before = weatherCalls.length;
    const sharing: ModelProvider = {
      id: 'double:sharing-index',
      async *stream(request) {
        requests.push(request.messages);
        if (request.messages.some((m) => m.role === 'tool')) {
          yield { type: 'text', delta: 'Both 21C.' };
          yield { type: 'finish', finishReason: 'stop' };
          return;
        }
        yield { type: 'tool_call', index: 0, id: 'a', name: 'get_weather', argumentsDelta: '{"city":"Oslo"}' };
        yield { type: 'tool_call', index: 0, id: 'b', name: 'get_weather', argumentsDelta: '{"city":"Lima"}' };
        yield { type: 'tool_call', index: 0, id: 'a', argumentsDelta: '', providerData: { sig: 'a' } };
        yield { type: 'finish', finishReason: 'tool_calls' };
      },
    };
    const agent = await createAgent({ model: sharing, tools: [weather] });
    const events = await collect(agent.stream('Weather in Oslo and Lima?'));
    assert.equal(events.at(-1)!.type, 'agent.end', JSON.stringify(events.filter((e) => e.type.endsWith('error'))));
    assert.deepEqual(weatherCalls.slice(before), ['Oslo', 'Lima']);
    assert.deepEqual(events.filter((e) => e.type === 'tool.call').map((e) => e.type === 'tool.call' && e.callId), ['a', 'b']);
    const past = requests[1]!.find((m) => m.role === 'assistant');
    assert.deepEqual(past?.role === 'assistant' && past.toolCalls?.map((c) => [c.id, c.providerData]), [['a', { sig: 'a' }], ['b', undefined]]);
  });

  test('a response past its bounds (128 tool calls, 8 MiB) ends the run as provider_protocol, and the provider is told to stop', async () => {
    // Test doubles for a broken or hostile endpoint: they would stream for ever.
    const pulled = { calls: 0, text: 0 };
    const closed: string[] = [];
    const endlessCalls: ModelProvider = {
      id: 'test-double:endless-calls',
      async *stream() {
        try {
          for (let i = 0; ; i++) {
            pulled.calls++;
            yield { type: 'tool_call', index: i, name: 'get_weather', argumentsDelta: '{"city":"Oslo"}' };
          }
        } finally {
          closed.push('calls');
        }
      },
    };
    const endlessText: ModelProvider = {
      id: 'test-double:endless-text',
      async *stream() {
        try {
          for (;;) {
            pulled.text++;
            yield { type: 'text', delta: 'y'.repeat(65536) };
          }
        } finally {
          closed.push('text');
        }
      },
    };
    for (const provider of [endlessCalls, endlessText]) {
      const agent = await createAgent({ model: provider, tools: [weather] });
      const events = await collect(agent.stream('?'));
      const last = events.at(-1)!;
      assert.ok(last.type === 'agent.error' && last.error.code === 'provider_protocol', JSON.stringify(last).slice(0, 300));
      assert.match(last.error.message, /more than 128 tool calls|more than 8388608 bytes/);
      assert.ok(!events.some((e) => e.type === 'tool.call'), 'no call of a response past its bounds runs');
    }
    assert.equal(pulled.calls, 129);
    assert.equal(pulled.text, 129, '128 chunks of 64 KiB fill the 8 MiB; the next passes it');
    assert.deepEqual(closed, ['calls', 'text']);
  });

  test('a consumer that falls behind gets the text it has not read as one delta, and loses none', async () => {
    const chatty: ModelProvider = {
      id: 'test-double:chatty',
      async *stream() {
        for (let i = 0; i < 100_000; i++) yield { type: 'text', delta: i % 2 ? 'b' : 'a' };
        yield { type: 'finish', finishReason: 'stop' };
      },
    };
    const agent = await createAgent({ model: chatty });
    const ended = new Promise<void>((resolve) => agent.on((e) => void (e.type === 'agent.end' && resolve())));
    const events = agent.stream('?')[Symbol.asyncIterator]();
    const seen: AgentEvent[] = [(await events.next()).value as AgentEvent];
    await ended; // the whole run happened while nobody read
    for (let r = await events.next(); !r.done; r = await events.next()) seen.push(r.value);
    const deltas = seen.flatMap((e) => (e.type === 'text.delta' ? [e.delta] : []));
    assert.ok(deltas.length <= 3, `${deltas.length} text.delta events waited`);
    assert.equal(deltas.join(''), 'ab'.repeat(50_000));
    assert.equal(seen.at(-1)!.type, 'agent.end');
  });

  test('accepts a Zod 4 schema and validates with the JSON Schema it gives', async () => {
    server.reset();
    const add = tool({
      name: 'add',
      description: 'Adds two numbers',
      inputSchema: z.object({ a: z.number(), b: z.number() }),
      execute: ({ a, b }: { a: number; b: number }) => ({ sum: a + b }),
    });
    assert.equal((add.inputSchema as any).type, 'object');
    server.enqueue({ toolCalls: [{ name: 'add', arguments: { a: 2, b: 'x' } }] }, { toolCalls: [{ name: 'add', arguments: { a: 2, b: 3 } }] }, { text: '5' });
    const agent = await createAgent({ model: model(), tools: [add] });
    const events = await collect(agent.stream('2+3?'));
    assert.equal(events.find((e) => e.type === 'tool.execute.error')?.type, 'tool.execute.error');
    const end = events.find((e) => e.type === 'tool.execute.end');
    assert.deepEqual(end && end.type === 'tool.execute.end' && end.result, { sum: 5 });
  });

  test('an ArkType schema types the arguments too (its large type once made TypeScript give up, TS2589), and a tool list may be readonly', async () => {
    server.reset();
    const query = type({ q: 'string', 'limit?': 'number' });
    const search = tool({
      name: 'search',
      description: 'Searches',
      inputSchema: query,
      execute: (args) => {
        const q: string = args.q;
        // @ts-expect-error `limit` is an optional number
        const wrong: string = args.limit;
        void wrong;
        return { hits: q.length };
      },
    });
    server.enqueue({ toolCalls: [{ name: 'search', arguments: { q: 'hello' } }] }, { text: 'done' });
    const tools = [search] as const;
    const agent = await createAgent({ model: model(), tools, emergent: { enabled: false, allowedSandboxAPIs: ['fetch'] as const } });
    const events = await collect(agent.stream('find'));
    const end = events.find((e) => e.type === 'tool.execute.end');
    assert.ok(end?.type === 'tool.execute.end', JSON.stringify(events.map((e) => e.type)));
    assert.deepEqual(end.result, { hits: 5 });
    await agent.close();
  });

  test('an ArkType problem with the whole arguments is reported at (root), not at /0', async () => {
    server.reset();
    const pair = type({ a: 'number', b: 'number' }).narrow((o, ctx) => o.a < o.b || ctx.mustBe('a pair in order'));
    const order = tool({ name: 'order', description: 'Orders a pair', inputSchema: pair, execute: ({ a, b }) => ({ a, b }) });
    server.enqueue({ toolCalls: [{ name: 'order', arguments: { a: 3, b: 1 } }] }, { text: 'done' });
    const agent = await createAgent({ model: model(), tools: [order] });
    const events = await collect(agent.stream('order 3 and 1'));
    const failed = events.find((e) => e.type === 'tool.execute.error');
    assert.ok(failed?.type === 'tool.execute.error', JSON.stringify(events.map((e) => e.type)));
    assert.match(failed.error.message, /\(root\): must be a pair in order/);
    await agent.close();
  });

  test('a Zod schema parses what the tool gets and returns: defaults, transforms and refinements apply', async () => {
    server.reset();
    const seen: unknown[] = [];
    const greet = tool({
      name: 'greet',
      description: 'Greets someone a number of times',
      inputSchema: z.object({ name: z.string().trim().min(1), times: z.number().default(2), even: z.number().refine((n) => n % 2 === 0, 'must be even') }),
      outputSchema: z.object({ text: z.string(), at: z.string().default('now') }),
      execute: (args) => {
        // Typed from the schema: `times` is a number here, defaulted (with `any`, the
        // expect-error below would be unused, and the type check of the tests would fail).
        const times: number = args.times;
        // @ts-expect-error `name` is a string
        const wrong: number = args.name;
        void wrong;
        seen.push(args);
        return { text: `hi ${args.name}`.repeat(times) };
      },
    });
    server.enqueue(
      { toolCalls: [{ name: 'greet', arguments: { name: '  Bob  ', even: 3 } }] },
      { toolCalls: [{ name: 'greet', arguments: { name: '  Bob  ', even: 4 } }] },
      { text: 'done' },
    );
    const agent = await createAgent({ model: model(), tools: [greet] });
    const events = await collect(agent.stream('greet Bob'));
    const failed = events.find((e) => e.type === 'tool.execute.error');
    assert.ok(failed && failed.type === 'tool.execute.error', 'the refinement failed the first call');
    assert.equal(failed.error.code, 'invalid_arguments');
    assert.match(failed.error.message, /\/even: must be even/);
    assert.deepEqual(seen, [{ name: 'Bob', times: 2, even: 4 }], 'execute got the parsed arguments, once');
    const end = events.find((e) => e.type === 'tool.execute.end');
    assert.deepEqual(end && end.type === 'tool.execute.end' && end.result, { text: 'hi Bobhi Bob', at: 'now' });
    await agent.close();
  });

  test('a needsApproval rule decides on the parsed arguments: a default the model left out can need a human', async () => {
    server.reset();
    const ran: unknown[] = [];
    const pay = tool({
      name: 'pay',
      description: 'Pays someone',
      inputSchema: z.object({ to: z.string().refine((to) => to !== '', 'who to pay'), amount: z.number().default(5000) }),
      needsApproval: (args) => args.amount > 1000,
      execute: (args) => {
        ran.push(args);
        return { paid: args.amount };
      },
    });
    server.enqueue({ toolCalls: [{ name: 'pay', arguments: { to: 'bob' } }] });
    const agent = await createAgent({ model: model(), tools: [pay] });
    const result = await agent.run('pay bob');
    assert.equal(result.status, 'paused', 'the default amount, 5000, needed approval');
    assert.deepEqual(ran, []);
    // The human is shown what the call will act on, the default amount included (before: the
    // model's `{ to: 'bob' }`, and 5000 paid on an approval that never showed it).
    assert.deepEqual(result.pendingApprovals.map((a) => a.arguments), [{ to: 'bob', amount: 5000 }]);
    // A tool that always needs approval shows its parsed arguments too; a transform's output as JSON.
    const wire = tool({
      name: 'wire',
      description: 'Wires money',
      inputSchema: z.object({ to: z.string(), currency: z.string().default('usd').transform((c) => c.toUpperCase()) }),
      needsApproval: true,
      execute: (args) => ({ sent: args.currency }),
    });
    server.enqueue({ toolCalls: [{ name: 'wire', arguments: { to: 'ann' } }] }, { text: 'Sent.' });
    const wiring = await createAgent({ model: model(), tools: [wire] });
    const paused = await wiring.run('wire ann');
    assert.deepEqual(paused.pendingApprovals.map((a) => a.arguments), [{ to: 'ann', currency: 'USD' }]);
    const resumed = await wiring.resume(paused, { approvals: [{ id: paused.pendingApprovals[0]!.id, approved: true }] });
    assert.equal(resumed.text, 'Sent.');
    assert.match(server.requests.at(-1)!.messages.at(-1)!.content ?? '', /"sent":"USD"/);
    await wiring.close();
    // Arguments the schema refuses ask no human: the call fails on them, and the model hears why.
    // (A refinement, not a type: the core's JSON Schema check would catch a wrong type first.)
    server.enqueue({ toolCalls: [{ name: 'pay', arguments: { to: '' } }] }, { text: 'sorry' });
    const events = await collect(agent.stream('pay 7'));
    assert.equal(events.at(-1)?.type, 'agent.end', 'no pause');
    const failed = events.find((e) => e.type === 'tool.execute.error');
    assert.ok(failed?.type === 'tool.execute.error' && failed.error.code === 'invalid_arguments', JSON.stringify(failed));
    assert.deepEqual(ran, []);
    await agent.close();
  });

  test('a listener may resume a run as it hears agent.paused: the resume waits for the pause to be let go of', async () => {
    server.reset();
    server.enqueue({ toolCalls: [{ name: 'pay', arguments: { to: 'bob' } }] }, { text: 'Paid.' });
    const pay = tool({ name: 'pay', description: 'Pays', inputSchema: { type: 'object', properties: { to: { type: 'string' } } }, needsApproval: true, execute: () => ({ paid: true }) });
    const agent = await createAgent({ model: model(), tools: [pay] });
    let resumed: Promise<unknown> | undefined;
    agent.on((event) => {
      if (event.type !== 'agent.paused') return;
      // Before: invalid_resume, "run … is already running in this agent".
      resumed = agent.resume({ runId: event.runId, state: event.state }, { approvals: event.approvals.map((a) => ({ id: a.id, approved: true })) });
    });
    assert.equal((await agent.run('pay bob')).status, 'paused');
    assert.ok(resumed, 'the listener heard the pause');
    assert.equal(((await resumed) as { text: string }).text, 'Paid.');
    await agent.close();
  });

  test('a returns schema\'s own failure is the host\'s: output_check_failed at once, the model not asked again', async () => {
    server.reset();
    const base = z.object({ n: z.number() });
    const broken = { ...base, '~standard': { ...base['~standard'], validate: () => { throw new TypeError('schema library bug'); } } };
    server.enqueue({ text: '{"n": 1}' });
    const agent = await createAgent({ model: model(), returns: broken });
    await assert.rejects(agent.run('?'), (e: unknown) => e instanceof AgentRunError && e.code === 'output_check_failed' && /schema library bug/.test(e.message));
    assert.equal(server.requests.length, 1);
    await agent.close();
  });

  test('an abort ends a run while its returns schema checks the answer', async () => {
    server.reset();
    let validations = 0;
    const Out = z.object({ n: z.number() }).refine(async () => {
      validations++;
      await new Promise(() => {}); // never decides
      return true;
    });
    server.enqueue({ text: '{"n": 1}' });
    const agent = await createAgent({ model: model(), returns: Out });
    const controller = new AbortController();
    setTimeout(() => controller.abort(), 100);
    const started = performance.now();
    await assert.rejects(agent.run('?', { signal: controller.signal }), AbortError);
    assert.ok(performance.now() - started < 2000, 'the run did not wait for the check');
    assert.ok(validations >= 1, 'the check had started');
    await agent.close();
  });

  test('a Standard Schema whose validate answers with a thenable, and a tool returning one, still parse', async () => {
    server.reset();
    const { runInNewContext } = await import('node:vm');
    const base = z.object({ text: z.string().default('x') });
    // A schema library whose validate is async, in another realm (its promises are not this realm's Promise).
    const foreign = { ...base, '~standard': { ...base['~standard'], validate: (v: unknown) => runInNewContext('Promise.resolve(r)', { r: base['~standard'].validate(v) }) } };
    const seen: unknown[] = [];
    const echo = tool({
      name: 'echo',
      description: 'Echoes',
      inputSchema: foreign,
      outputSchema: z.object({ text: z.string(), n: z.number().default(1) }),
      execute: (args) => {
        seen.push(args);
        return runInNewContext('Promise.resolve({ text: t })', { t: (args as { text: string }).text }) as Promise<{ text: string }>;
      },
    });
    server.enqueue({ toolCalls: [{ name: 'echo', arguments: {} }] }, { text: 'done' });
    const agent = await createAgent({ model: model(), tools: [echo] });
    const events = await collect(agent.stream('echo'));
    assert.deepEqual(seen, [{ text: 'x' }], 'execute got the parsed arguments, not undefined');
    const end = events.find((e) => e.type === 'tool.execute.end');
    assert.deepEqual(end && end.type === 'tool.execute.end' && end.result, { text: 'x', n: 1 });
    await agent.close();
  });

  test('a Zod returns schema gives the parsed output; an answer its refinements refuse is asked again, like a schema violation', async () => {
    server.reset();
    let refinements = 0;
    const Out = z.object({
      score: z.number().refine((n) => (refinements++, n <= 10), 'at most 10'),
      tags: z.array(z.string()).default([]),
      day: z.string().transform((s) => new Date(s)),
    });
    server.enqueue({ text: '{"score": 99, "day": "2024-01-02"}' }, { text: '{"score": 7, "day": "2024-01-02"}' });
    const agent = await createAgent({ model: model(), returns: Out, maxOutputRetries: 1 });
    const heard: AgentEvent[] = [];
    agent.on((e) => heard.push(e));
    const streamed: AgentEvent[] = [];
    const result = await agent.run('?');
    assert.equal(result.status, 'completed');
    const output = result.output!;
    assert.equal(output.score, 7);
    assert.deepEqual(output.tags, []);
    assert.ok(output.day instanceof Date && output.day.getUTCDate() === 2, 'the transform ran');
    assert.equal(refinements, 2, 'the schema ran once per answer: the refused one and the accepted one');
    const retry = heard.find((e) => e.type === 'output.retry');
    assert.ok(retry && retry.type === 'output.retry' && /score: at most 10/.test(retry.reason), 'the refinement asked again, with its reason');
    // Events are plain JSON, the same for listeners and streams: agent.end carries the accepted answer as JSON.
    const end = heard.find((e) => e.type === 'agent.end');
    assert.deepEqual(end && end.type === 'agent.end' && end.output, { score: 7, day: '2024-01-02' });
    // A model that keeps to a refused answer ends as any invalid structured output does.
    server.setResponder(() => ({ text: '{"score": 99, "day": "2024-01-02"}' }));
    for await (const e of agent.stream('?')) streamed.push(e);
    server.setResponder(undefined);
    const failed = streamed.at(-1);
    assert.ok(failed?.type === 'agent.error' && failed.error.code === 'structured_output_invalid' && /at most 10/.test(failed.error.message), JSON.stringify(failed));
    await agent.close();
  });

  test('structured returns give the parsed, validated value', async () => {
    server.reset();
    server.enqueue({ text: 'warm' }, { text: '```json\n{"celsius": 21}\n```' });
    const agent = await createAgent({ model: model(), returns: z.object({ celsius: z.number() }) });
    const result = await agent.run('?');
    assert.equal(result.status, 'completed');
    assert.deepEqual(result.output, { celsius: 21 });
    if (result.status === 'completed') {
      // Typed from the returns schema, with no type argument (with `unknown`, the expect-error
      // below would be unused and the type check of the tests would fail).
      const celsius: number = result.output.celsius;
      // @ts-expect-error `celsius` is a number
      const wrong: string = result.output.celsius;
      void [celsius, wrong];
    }
    // Without returns, the output is the answer's text.
    server.enqueue({ text: 'plain' });
    const plain = await createAgent({ model: model() });
    const answered = await plain.run('?');
    if (answered.status === 'completed') {
      const text: string = answered.output;
      // @ts-expect-error the output is a string
      const wrongText: number = answered.output;
      void [text, wrongText];
    }
    assert.equal(answered.output, 'plain');
    await Promise.all([agent.close(), plain.close()]);
  });

  test("the codes of agent.error and tool.execute.error events are CrucibleErrorCode, so a switch on them is checked", async () => {
    server.reset();
    server.setResponder(() => ({ toolCalls: [{ name: 'get_weather', arguments: { town: 'Oslo' } }] }));
    const agent = await createAgent({ model: model(), tools: [weather], maxTurns: 2 });
    const codes: CrucibleErrorCode[] = [];
    for (const event of await collect(agent.stream('loop'))) {
      if (event.type !== 'agent.error' && event.type !== 'tool.execute.error') continue;
      const code = event.error.code;
      switch (code) {
        // @ts-expect-error a misspelt code is a type error (it was not while codes were `string`)
        case 'max_turn_exceeded':
          assert.fail('no such code');
          break;
        default:
          codes.push(code);
      }
    }
    assert.deepEqual(codes, ['invalid_arguments', 'max_turns_exceeded']);
    server.setResponder(undefined as any);
    await agent.close();
    // A store of one's own failing with a code the runtime does not define: `store_error`, so
    // the type holds (its message says what the store said).
    const base = memoryStore();
    const failing = new Error('the disk is on fire');
    const store: Store = { ...base, get: (k) => base.get(k), scan: (p) => base.scan(p), delete: (k) => base.delete(k), put: () => Promise.reject(Object.assign(failing, { code: 'store_on_fire' })), batch: () => Promise.reject(Object.assign(failing, { code: 'store_on_fire' })) };
    server.reset();
    server.enqueue({ text: 'fine' });
    const stored = await createAgent({ model: model(), store });
    const last = (await collect(stored.stream('hi'))).at(-1)!;
    assert.ok(last.type === 'agent.error' && last.error.code === 'store_error' && /the disk is on fire/.test(last.error.message), JSON.stringify(last));
    await stored.close();
  });

  test('limits end the run with a typed error', async () => {
    server.reset();
    server.setResponder(() => ({ toolCalls: [{ name: 'get_weather', arguments: { city: 'Oslo' } }] }));
    const agent = await createAgent({ model: model(), tools: [weather], maxTurns: 2 });
    await assert.rejects(agent.run('loop'), (e: unknown) => e instanceof AgentRunError && e.code === 'max_turns_exceeded');
    server.setResponder(undefined as any);
  });

  test('tool calls on the last turn are not run: a refund the model asks for then does not happen', async () => {
    const refunded: number[] = [];
    const refund = tool({
      name: 'refund',
      description: 'Refund an order',
      inputSchema: { type: 'object', properties: { order: { type: 'integer' } }, required: ['order'] },
      execute: ({ order }: { order: number }) => {
        refunded.push(order);
        return { refunded: order };
      },
    });
    // A scripted model that asks for a refund on every turn.
    let turn = 0;
    const refunding: ModelProvider = {
      id: 'double:refunding',
      async *stream() {
        turn += 1;
        yield { type: 'tool_call', index: 0, id: `call_${turn}`, name: 'refund', argumentsDelta: JSON.stringify({ order: turn }) };
        yield { type: 'finish', finishReason: 'tool_calls' };
      },
    };
    const agent = await createAgent({ model: refunding, tools: [refund], maxTurns: 2 });
    const events = await collect(agent.stream('refund everything'));
    const last = events.at(-1)!;
    assert.ok(last.type === 'agent.error' && last.error.code === 'max_turns_exceeded', JSON.stringify(last));
    assert.match(last.error.message, /the 1 tool call its last answer asked for was not run/);
    assert.equal(turn, 2);
    assert.deepEqual(refunded, [1], 'the second turn\'s refund had no turn left for its result');
    assert.deepEqual(events.flatMap((e) => (e.type === 'tool.execute.start' ? [e.callId] : [])), ['call_1']);
    // run() rejects the same way.
    await assert.rejects(agent.run('again'), (e: unknown) => e instanceof AgentRunError && e.code === 'max_turns_exceeded' && /was not run/.test(e.message));
    assert.deepEqual(refunded, [1, 3]);
    await agent.close();
  });

  test('a session keeps the newest exchanges within sessionHistory.maxBytes over many runs with big tool results', async () => {
    const page = tool({ name: 'page', description: 'A page', inputSchema: { type: 'object', properties: {} }, execute: () => ({ text: 'x'.repeat(60_000) }) });
    // A scripted model: a tool call for each new input, an answer once the result is in.
    let largestSent = 0;
    const reader: ModelProvider = {
      id: 'double:reader',
      async *stream(request) {
        largestSent = Math.max(largestSent, JSON.stringify(request.messages).length);
        if (request.messages.at(-1)!.role === 'tool') {
          yield { type: 'text', delta: 'Read it.' };
          yield { type: 'finish', finishReason: 'stop' };
        } else {
          yield { type: 'tool_call', index: 0, id: `call_${request.messages.length}`, name: 'page', argumentsDelta: '{}' };
          yield { type: 'finish', finishReason: 'tool_calls' };
        }
      },
    };
    const maxBytes = 300_000;
    const agent = await createAgent({ model: reader, tools: [page], sessionHistory: { maxBytes } });
    for (let i = 1; i <= 30; i++) {
      await agent.run(`page ${i}`, { sessionId: 's' });
      const history = agent.history('s') as Array<{ role: string; content: string }>;
      assert.ok(JSON.stringify(history).length <= maxBytes, `run ${i}: ${JSON.stringify(history).length} bytes`);
      assert.equal(history[0]!.role, 'user', `run ${i}: the history starts at an exchange`);
      assert.equal(history.at(-4)!.content, `page ${i}`, `run ${i}: its own exchange is kept`);
    }
    // Four exchanges of about 60 KB fit; the model never got more than the bound and one exchange.
    assert.deepEqual((agent.history('s') as Array<{ role: string; content: string }>).filter((m) => m.role === 'user').map((m) => m.content), ['page 27', 'page 28', 'page 29', 'page 30']);
    assert.ok(largestSent < maxBytes + 70_000, `${largestSent}`);
    await agent.close();
    for (const [sessionHistory, message] of [
      [{ maxBytes: 0 }, /sessionHistory\.maxBytes must be at least 1/],
      [{ maxMessages: 0 }, /sessionHistory\.maxMessages must be a whole number from 1 to 4294967295, got 0/],
      [{ maxBytes: -1 }, /createAgent: sessionHistory\.maxBytes must be a whole number/],
      [{ maxMessage: 5 }, /createAgent: sessionHistory: unknown option maxMessage; the options are maxMessages, maxBytes/],
      ['8MB', /createAgent: sessionHistory must be an object/],
    ] as const) {
      await assert.rejects(createAgent({ model: reader, sessionHistory: sessionHistory as never }), { code: 'invalid_config', message });
    }
  });

  test('an HTTP 500 from the provider ends the run with provider_http', async () => {
    server.reset();
    server.enqueue({ status: 500, body: '{"error":{"message":"boom"}}' });
    const agent = await createAgent({ model: model() });
    await assert.rejects(agent.run('?'), (e: unknown) => e instanceof AgentRunError && e.code === 'provider_http' && e.status === 500);
    // The status tells a refused key from a rate limit without reading the message.
    server.enqueue({ status: 401, body: '{"error":{"message":"bad key"}}' });
    await assert.rejects(agent.run('?'), (e: unknown) => e instanceof AgentRunError && e.status === 401);
    // The provider's own error is the cause, with what only it knows (retryable, the body).
    server.enqueue({ status: 401, body: '{"error":{"message":"bad key"}}' });
    await assert.rejects(agent.run('?'), (e: unknown) => {
      assert.ok(e instanceof AgentRunError && e.cause instanceof ProviderError, String(e));
      assert.equal(e.cause.status, 401);
      assert.equal(e.cause.retryable, false);
      assert.match(e.cause.body ?? '', /bad key/);
      return true;
    });
    // The agent keeps serving.
    server.enqueue({ text: 'fine' });
    assert.equal((await agent.run('again?')).output, 'fine');
  });

  test('aborting stops the in-flight fetch and ends the run cleanly', async () => {
    server.reset();
    server.enqueue({ text: ['first ', 'second'], hangMs: 10_000 });
    const agent = await createAgent({ model: model() });
    const controller = new AbortController();
    const started = Date.now();
    const seen: AgentEvent[] = [];
    for await (const e of agent.stream('?', { signal: controller.signal })) {
      seen.push(e);
      if (e.type === 'text.delta') controller.abort();
    }
    assert.ok(Date.now() - started < 3000, 'abort is prompt, not after the 10 s hang');
    const last = seen.at(-1)!;
    assert.ok(last.type === 'agent.error' && last.error.code === 'aborted', JSON.stringify(last));

    server.enqueue({ text: 'slow', delayMs: 10_000 });
    await assert.rejects(agent.run('?', { signal: AbortSignal.timeout(200) }), (e: unknown) => {
      assert.ok(e instanceof AbortError && e.code === 'aborted', String(e));
      // The aborted run is named (a store keeps it resumable under that id) with its usage so far.
      assert.match(e.runId ?? '', /^run_/);
      assert.equal(e.usage?.inputTokens, 0);
      // A deadline is told from a user's stop by the signal's reason.
      assert.equal((e.cause as Error | undefined)?.name, 'TimeoutError', String(e.cause));
      return true;
    });
    assert.ok(Date.now() - started < 5000);
    server.enqueue({ text: 'slow', delayMs: 10_000 });
    const stop = new AbortController();
    setTimeout(() => stop.abort('the user left'), 100);
    await assert.rejects(agent.run('?', { signal: stop.signal }), (e: unknown) => e instanceof AbortError && e.cause === 'the user left');
    // Options are read once: a getter asked again could give another signal than the run has.
    server.enqueue({ text: 'slow', delayMs: 10_000 });
    const once = new AbortController();
    let reads = 0;
    setTimeout(() => once.abort('read once'), 100);
    const options = {
      get signal() {
        reads++;
        return reads === 1 ? once.signal : new AbortController().signal;
      },
    };
    await assert.rejects(agent.run('?', options), (e: unknown) => e instanceof AbortError && e.cause === 'read once');
    assert.equal(reads, 1);
  });

  test('close() aborts the runs still going and waits for them', async () => {
    server.reset();
    server.enqueue({ text: 'slow', delayMs: 10_000 });
    const agent = await createAgent({ model: model() });
    const ended: string[] = [];
    agent.on((e) => {
      if (e.type === 'agent.error') ended.push(e.error.code);
    });
    const running = agent.run('?');
    await new Promise((resolve) => setTimeout(resolve, 50));
    const started = Date.now();
    const [first, second] = [agent.close(), agent.close()];
    await second; // a second close() waits for the first
    assert.deepEqual(ended, ['aborted'], 'the run had ended when close() resolved');
    await first;
    assert.ok(Date.now() - started < 3000, 'close did not wait out the 10 s answer');
    await assert.rejects(running, (e: unknown) => e instanceof AbortError);
  });

  test('a provider of your own that fails with fetch\'s AbortError ends an aborted run as aborted', async () => {
    server.reset();
    server.enqueue({ text: 'slow', delayMs: 10_000 });
    // Not one of ours: it reads the reply with a plain fetch and lets fetch's error through.
    const ownProvider: ModelProvider = {
      id: 'own:fetch',
      async *stream(_request, options) {
        const res = await fetch(`${server.openaiBaseURL}/chat/completions`, { method: 'POST', body: '{}', signal: options?.signal });
        yield { type: 'text', delta: await res.text() };
      },
    };
    const agent = await createAgent({ model: ownProvider });
    await assert.rejects(agent.run('?', { signal: AbortSignal.timeout(200) }), (e: unknown) => e instanceof AbortError && e.code === 'aborted');
  });

  test('a provider of your own failing with a code the runtime does not define fails the run as provider_protocol, the code in the message', async () => {
    const failing = (code: string): ModelProvider => ({
      id: `own:${code}`,
      // eslint-disable-next-line require-yield
      async *stream() {
        throw Object.assign(new Error('socket hang up'), { code });
      },
    });
    for (const code of ['ECONNRESET', 'max_turns_exceeded', 'aborted']) {
      const agent = await createAgent({ model: failing(code) });
      await assert.rejects(agent.run('?'), (e: unknown) => {
        assert.ok(e instanceof AgentRunError && !(e instanceof AbortError), `${code}: got ${String(e)}`);
        assert.equal(e.code, 'provider_protocol');
        assert.match(e.message, /socket hang up/);
        return true;
      });
      await agent.close();
    }
  });

  test('runs leave nothing of their waits behind in the core', async () => {
    // Each wait of a run on its abort signal (which never fires) used to leave two closures.
    const quick: ModelProvider = {
      id: 'double:quick',
      async *stream() {
        yield { type: 'text', delta: 'hi' };
        yield { type: 'finish', finishReason: 'stop' };
      },
    };
    const agent = await createAgent({ model: quick });
    for (let i = 0; i < 20; i++) await agent.run('?', { sessionId: `warm${i}` });
    await new Promise((resolve) => setTimeout(resolve, 50));
    const before = functionsHeldByCore();
    for (let i = 0; i < 200; i++) {
      await agent.run('?', { sessionId: `s${i}` });
      await agent.endSession(`s${i}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
    const more = functionsHeldByCore() - before;
    assert.ok(more < 20, `the core holds ${more} more functions after 200 runs`);
    await agent.close();
  });

  test('a provider of your own that ignores the signal, or ends quietly on it, cannot keep an aborted run going', async () => {
    // One streams on past the abort and never ends; the other stops early, as if done.
    const ignoring: ModelProvider = {
      id: 'own:ignores-abort',
      async *stream() {
        yield { type: 'text', delta: 'partial' };
        await new Promise(() => {});
      },
    };
    const quiet: ModelProvider = {
      id: 'own:quiet-on-abort',
      async *stream(_request, options) {
        yield { type: 'text', delta: 'partial ans' };
        await new Promise((resolve) => options?.signal?.addEventListener('abort', resolve, { once: true }));
      },
    };
    for (const provider of [ignoring, quiet]) {
      const agent = await createAgent({ model: provider });
      await assert.rejects(agent.run('?', { signal: AbortSignal.timeout(100), sessionId: 's' }), (e: unknown) => e instanceof AbortError, provider.id);
      // Breaking out of the loop ends the run too, and close() does not wait for the provider.
      for await (const e of agent.stream('?', { sessionId: 's' })) if (e.type === 'text.delta') break;
      await agent.close();
    }
  });

  test('an answer the core stops reading (past its bounds) aborts the provider\'s signal, and the server sees its request end', async () => {
    // A raw SSE server: more tool calls than one response may hold, then silence, the
    // connection left open (a model still writing).
    const { createServer } = await import('node:http');
    let requestClosed!: Promise<void>;
    const raw = createServer((req, res) => {
      requestClosed = new Promise((resolve) => res.once('close', resolve));
      req.resume();
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      for (let index = 0; index < 200; index++) {
        const call = { index, id: `call_${index}`, type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } };
        res.write(`data: ${JSON.stringify({ choices: [{ index: 0, delta: { tool_calls: [call] } }] })}\n\n`);
      }
    });
    await new Promise<void>((resolve) => raw.listen(0, '127.0.0.1', resolve));
    try {
      const baseURL = `http://127.0.0.1:${(raw.address() as import('node:net').AddressInfo).port}/v1`;
      const real = openai({ baseURL, apiKey: 'none', model: 'm', retry: { maxRetries: 0 } });
      let signal: AbortSignal | undefined;
      const recording: ModelProvider = {
        id: real.id,
        stream: (request, options) => {
          signal = options?.signal;
          return real.stream(request, options);
        },
      };
      const agent = await createAgent({ model: recording, tools: [weather] });
      await assert.rejects(agent.run('weather everywhere?'), (e: unknown) => e instanceof CrucibleError && !(e instanceof AbortError));
      assert.equal(signal?.aborted, true, "the provider's signal was aborted");
      const late = new Promise((_, reject) => setTimeout(() => reject(new Error('the server never saw its request end')), 3000).unref());
      await Promise.race([requestClosed, late]);
      await agent.close();
    } finally {
      raw.closeAllConnections();
      raw.close();
    }
  });

  test('breaking out of for await aborts the run: the tool it was running gets its signal, and the model is not asked again', async () => {
    server.reset();
    server.enqueue({ toolCalls: [{ name: 'wait', arguments: {} }] }, { text: 'never asked' });
    let signalled: Promise<void> | undefined;
    const wait = tool({
      name: 'wait',
      description: 'Waits for its abort signal',
      inputSchema: { type: 'object' },
      execute: (_args, { signal }) => {
        signalled = new Promise((resolve) => signal.addEventListener('abort', () => resolve(), { once: true }));
        return new Promise(() => {});
      },
    });
    const agent = await createAgent({ model: model(), tools: [wait] });
    const started = Date.now();
    for await (const e of agent.stream('?')) {
      if (e.type === 'tool.execute.start') break;
    }
    assert.ok(signalled, 'the tool ran');
    const late = new Promise((_, reject) => setTimeout(() => reject(new Error('the tool never got its abort signal')), 3000).unref());
    await Promise.race([signalled, late]);
    assert.ok(Date.now() - started < 3000, 'the tool was told at once');
    await new Promise((resolve) => setTimeout(resolve, 100));
    assert.equal(server.requests.length, 1, 'the model was asked once: the run ended with the break');
    // The agent keeps serving (the reply the ended run never asked for is dropped first).
    server.reset();
    server.enqueue({ text: 'fine' });
    assert.equal((await agent.run('again?')).output, 'fine');
  });

  test('aborting while a tool that ignores its signal runs ends the run promptly, without waiting for it', async () => {
    server.reset();
    server.enqueue({ toolCalls: [{ name: 'stubborn', arguments: {} }] }, { text: 'never asked' });
    let finished = false;
    const stubborn = tool({
      name: 'stubborn',
      description: 'Takes four seconds and ignores its abort signal',
      inputSchema: { type: 'object' },
      execute: () =>
        new Promise<{ done: boolean }>((resolve) =>
          setTimeout(() => {
            finished = true;
            resolve({ done: true });
          }, 4000).unref(),
        ),
    });
    const agent = await createAgent({ model: model(), tools: [stubborn] });
    const controller = new AbortController();
    const started = Date.now();
    const seen: AgentEvent[] = [];
    for await (const e of agent.stream('?', { signal: controller.signal })) {
      seen.push(e);
      if (e.type === 'tool.execute.start') setTimeout(() => controller.abort(), 50);
    }
    assert.ok(Date.now() - started < 2000, `ended after ${Date.now() - started} ms, not when the tool finished`);
    assert.equal(finished, false);
    const last = seen.at(-1)!;
    assert.ok(last.type === 'agent.error' && last.error.code === 'aborted', JSON.stringify(last));
    assert.equal(server.requests.length, 1, 'no model turn after the abort');
    // The agent keeps serving.
    server.reset();
    server.enqueue({ text: 'fine' });
    assert.equal((await agent.run('again?')).output, 'fine');
  });

  test('rejects bad configuration with a typed error', async () => {
    // tool() refuses the name itself (see below); createAgent checks a tool made without it too.
    const badName = { ...tool({ name: 'ok_name', description: '', inputSchema: { type: 'object' }, execute: () => 1 }), name: 'bad name!' };
    await assert.rejects(createAgent({ model: model(), tools: [badName] }), { code: 'invalid_config', message: /must match/ });
    const stringArgs = { ...tool({ name: 'ok_name', description: '', inputSchema: { type: 'object' }, execute: () => 1 }), inputSchema: { type: 'string' } };
    await assert.rejects(createAgent({ model: model(), tools: [stringArgs] }), { code: 'invalid_config', message: /tool "ok_name": inputSchema must describe an object/ });
  });

  test('a map of properties where a schema goes (a Zod shape, or JSON Schema properties unwrapped) is refused: it would check nothing', async () => {
    const shapes: unknown[] = [{ city: z.string() }, { city: { type: 'string' } }, { city: type('string') }];
    for (const shape of shapes) {
      assert.throws(() => tool({ name: 'weather', description: 'w', inputSchema: shape as never, execute: () => 1 }), {
        code: 'invalid_config',
        message: /^tool "weather": inputSchema looks like a map of properties \(\{ "city": … \}\), not a JSON Schema: write \{ type: 'object', properties: \{ "city": … \} \}/,
      });
    }
    await assert.rejects(createAgent({ model: model(), returns: { name: z.string() } as never }), { code: 'invalid_config', message: /returns looks like a map of properties/ });
    // Schemas stay schemas: the empty one, keywords alone, and Standard Schemas.
    for (const inputSchema of [{}, { type: 'object' }, { properties: { city: { type: 'string' } } }, { anyOf: [{ type: 'object' }] }, z.object({ city: z.string() })]) {
      assert.ok(tool({ name: 'weather', description: 'w', inputSchema: inputSchema as never, execute: () => 1 }));
    }
  });

  test('an option createAgent does not have is refused, not ignored, with the name it goes by here', async () => {
    await assert.rejects(createAgent({ model: model(), system: 'Be brief.' } as never), { code: 'invalid_config', message: /createAgent: unknown option system \(did you mean instructions\?\)/ });
    await assert.rejects(createAgent({ model: model(), emergent: { enabled: true, maxTools: 3 } } as never), { code: 'invalid_config', message: /createAgent: emergent: unknown option maxTools; the options are .*maxSessionTools/ });
    const agent = await createAgent({ model: model(), emergent: { enabled: false, statsFlushEvery: 4, auditCapacity: 10 } });
    await agent.close();
  });

  test('options that throw when read (a getter, a Proxy) fail run, resume, stream and close through their promise, never where they were called', async () => {
    const agent = await createAgent({ model: model() });
    const throwing = [
      new Proxy({}, { ownKeys: () => { throw new Error('ownKeys trap throws'); } }),
      { get signal(): never { throw new Error('signal getter throws'); } },
      { get sessionId(): never { throw new Error('sessionId getter throws'); } },
    ];
    const unreadable = (where: string, code = 'invalid_config') => (e: unknown) =>
      e instanceof CrucibleError && e.code === code && e.message.startsWith(`${where}: the options could not be read: `) && /throws/.test(String((e.cause as Error).message));
    for (const options of throwing) {
      let pending: Promise<unknown> | undefined;
      assert.doesNotThrow(() => void (pending = agent.run('hi', options as never)), 'run');
      await assert.rejects(pending!, unreadable('agent.run/stream'));
      await assert.rejects(agent.stream('hi', options as never).next(), unreadable('agent.run/stream'));
      if ('sessionId' in options) continue; // not an option of resume
      assert.doesNotThrow(() => void (pending = agent.resume('run_x', options as never)), 'resume');
      await assert.rejects(pending!, unreadable('agent.resume'));
    }
    assert.doesNotThrow(() => void agent.resume({ get runId(): never { throw new Error('runId getter throws'); } }).catch(() => undefined), 'resume of a run object');
    assert.deepEqual(agent.history('default'), [], 'nothing ran');
    let closing: Promise<void> | undefined;
    assert.doesNotThrow(() => void (closing = agent.close({ get flushTimeoutMs(): never { throw new Error('getter throws'); } })), 'close');
    await assert.rejects(closing!, unreadable('close', 'invalid_argument'));
    await agent.close();
  });

  test('createAgent options that throw when read (a getter, a Proxy) are invalid_config naming the option, with what they threw as its cause', async () => {
    const thrown = new Error('getter throws');
    const throws = (): never => {
      throw thrown;
    };
    const judge = { model: model() };
    const cases: [unknown, RegExp][] = [
      [{ model: model(), get maxTurns() { return throws(); } }, /^createAgent: maxTurns could not be read: getter throws$/],
      [{ get model() { return throws(); } }, /^createAgent: model could not be read/],
      [new Proxy({ model: model() }, { ownKeys: throws }), /^createAgent: the options could not be read: getter throws$/],
      [{ model: model(), sessionHistory: { get maxBytes() { return throws(); } } }, /^createAgent: sessionHistory\.maxBytes could not be read/],
      [{ model: model(), emergent: { enabled: true, get judge() { return throws(); } } }, /^createAgent: emergent\.judge could not be read/],
      [{ model: model(), emergent: { enabled: true, judge: { ...judge, get timeoutMs() { return throws(); } } } }, /^createAgent: emergent\.judge\.timeoutMs could not be read/],
      [{ model: model(), emergent: { enabled: true, promotionThreshold: new Proxy({}, { ownKeys: throws }) } }, /^createAgent: emergent\.promotionThreshold: the options could not be read/],
      [{ model: new Proxy(model(), { get: throws }) }, /^createAgent: model could not be read/],
      [{ model: model(), emergent: { enabled: true, judge: { model: new Proxy(model(), { get: throws }) } } }, /^createAgent: emergent\.judge\.model could not be read/],
      [{ model: model(), tools: [{ ...weather, get inputSchema() { return throws(); } }] }, /^createAgent: tools could not be read: getter throws$/],
      [{ model: model(), returns: { get '~standard'() { return throws(); } } }, /^createAgent: returns could not be read: getter throws$/],
      [{ model: model(), returns: new Proxy({}, { get: throws }) }, /^createAgent: returns could not be read/],
    ];
    for (const [options, message] of cases) {
      await assert.rejects(createAgent(options as never), (e: unknown) => {
        assert.ok(e instanceof CrucibleError && e.code === 'invalid_config', `${String(e)} for ${message}`);
        assert.match(e.message, message);
        assert.equal(e.cause, thrown);
        return true;
      });
    }
  });

  test('approvals of the wrong shape are invalid_config naming the decision and field, not a position in JSON the caller never wrote', async () => {
    const agent = await createAgent({ model: model() });
    const cases: [unknown, RegExp][] = [
      [{ id: 'a', approved: true }, /agent\.resume: approvals must be an array of \{ id, approved, reason\? \}, got object/],
      [[{ id: 5, approved: true }], /agent\.resume: approvals\[0\]\.id must be a string, got 5/],
      [[{ id: 'a', approved: true }, { id: 'b', approved: 'yes' }], /agent\.resume: approvals\[1\]\.approved must be true or false, got "yes"/],
      [[{ id: 'a', approved: false, reason: 7 }], /agent\.resume: approvals\[0\]\.reason must be a string, got 7/],
      [[null], /agent\.resume: approvals\[0\] must be an object \{ id, approved, reason\? \}, got null/],
    ];
    for (const [approvals, message] of cases) {
      await assert.rejects(agent.resume('run_x', { approvals: approvals as never }), (e: unknown) => {
        assert.ok(e instanceof CrucibleError && e.code === 'invalid_config', String(e));
        assert.match(e.message, message);
        assert.doesNotMatch(e.message, /line \d+ column \d+/);
        return true;
      });
    }
    // Absent, or null as other absent options: no decisions.
    await assert.rejects(agent.resume('run_x', { approvals: null as never }), { code: 'invalid_resume' });
    await agent.close();
  });

  test('a sparse array (a hole where an element should be) is refused like an array holding undefined, naming the option', async () => {
    // Array methods such as some() and map() skip holes: createAgent threw a bare TypeError
    // ("Iterator value undefined is not an entry object"), the others named JSON positions.
    /* eslint-disable no-sparse-arrays */
    await assert.rejects(createAgent({ model: model(), tools: [, weather] as never }), { name: 'CrucibleError', code: 'invalid_config', message: /`tools` must be an array of tools/ });
    await assert.rejects(createAgent({ model: model(), emergent: { enabled: true, allowedSandboxAPIs: [, 'fetch'] as never } }), {
      name: 'CrucibleError',
      code: 'invalid_config',
      message: /allowedSandboxAPIs must list host APIs the sandbox has \(fetch, crypto\); it names undefined/,
    });
    const agent = await createAgent({ model: model() });
    await assert.rejects(agent.resume('run_x', { approvals: [, { id: 'a', approved: true }] as never }), { code: 'invalid_config', message: /^agent\.resume: approvals\[0\] must be an object/ });
    /* eslint-enable no-sparse-arrays */
    await agent.close();
  });

  test('a run or resume option the agent does not have is refused: a misspelt sessionId would have run in the default session', async () => {
    const agent = await createAgent({ model: model() });
    await assert.rejects(agent.run('hi', { sesionId: 's1' } as never), { code: 'invalid_config', message: /agent\.run\/stream: unknown option sesionId; the options are signal, sessionId/ });
    await assert.rejects(agent.resume('run_x', { approval: [] } as never), { code: 'invalid_config', message: /agent\.resume: unknown option approval; the options are approvals, signal/ });
    assert.deepEqual(agent.history('default'), [], 'nothing ran');
    await agent.close();
  });
});

describe('tool() rejects options it cannot use with invalid_config', () => {
  const valid = { name: 'lookup', description: 'Looks up', inputSchema: { type: 'object' }, execute: () => 1 };
  /** Asserts `make` throws a CrucibleError `invalid_config` whose message matches every pattern. */
  function throwsInvalid(make: () => unknown, ...patterns: RegExp[]): void {
    assert.throws(make, (e: unknown) => {
      assert.ok(e instanceof CrucibleError, `not a CrucibleError: ${String(e)}`);
      assert.equal(e.code, 'invalid_config');
      for (const pattern of patterns) assert.match(e.message, pattern);
      return true;
    });
  }

  test('no options, or options that are not an object', () => {
    throwsInvalid(() => (tool as (o?: unknown) => unknown)(), /^tool\(\)/, /options object/);
    throwsInvalid(() => tool(undefined as never), /^tool\(\)/, /options object/);
    throwsInvalid(() => tool(null as never), /^tool\(\)/);
    throwsInvalid(() => tool('lookup' as never), /^tool\(\)/);
  });

  test('a missing or non-function execute names the tool', () => {
    const { execute: _execute, ...noExecute } = valid;
    throwsInvalid(() => tool(noExecute as never), /tool "lookup"/, /execute must be a function/, /undefined/);
    throwsInvalid(() => tool({ ...valid, execute: 'run' as never }), /tool "lookup"/, /execute must be a function/, /string/);
  });

  test('a missing, null or non-object inputSchema names the tool', () => {
    const { inputSchema: _schema, ...noSchema } = valid;
    throwsInvalid(() => tool(noSchema as never), /tool "lookup"/, /inputSchema/, /undefined/);
    throwsInvalid(() => tool({ ...valid, inputSchema: null as never }), /tool "lookup"/, /inputSchema/, /null/);
    throwsInvalid(() => tool({ ...valid, inputSchema: 'object' as never }), /tool "lookup"/, /inputSchema/, /string/);
    throwsInvalid(() => tool({ ...valid, inputSchema: [] as never }), /tool "lookup"/, /inputSchema/, /array/);
  });

  test('a name outside ^[A-Za-z0-9_-]{1,64}$ is refused by tool() itself', () => {
    for (const name of ['bad name!', '', 'x'.repeat(65), 'dot.ted']) {
      throwsInvalid(() => tool({ ...valid, name }), /name must match/, /A-Za-z0-9_-/);
    }
    throwsInvalid(() => tool({ ...valid, name: undefined as never }), /^tool\(\)/, /name must match/);
    throwsInvalid(() => tool({ ...valid, name: 42 as never }), /^tool\(\)/, /name must match/, /number/);
    assert.equal(tool({ ...valid, name: 'A-z_09' }).name, 'A-z_09');
  });

  test('a Standard Schema whose conversion throws becomes invalid_config naming the tool', () => {
    const cause = new Error('cannot represent transforms');
    const broken = { '~standard': { version: 1, vendor: 'acme', jsonSchema: { input: () => { throw cause; } } } };
    assert.throws(
      () => tool({ ...valid, inputSchema: broken }),
      (e: unknown) => e instanceof CrucibleError && e.code === 'invalid_config' && /tool "lookup": inputSchema/.test(e.message) && /cannot represent transforms/.test(e.message) && e.cause === cause,
    );
    // Zod 4 throws when a schema has no JSON Schema form.
    throwsInvalid(() => tool({ ...valid, inputSchema: z.object({ when: z.date() }) }), /tool "lookup": inputSchema/, /Date cannot be represented/);
    throwsInvalid(() => tool({ ...valid, outputSchema: z.object({ n: z.bigint() }) }), /tool "lookup": outputSchema/, /BigInt/);
  });

  test('an inputSchema that rules out an object is refused: arguments are a JSON object', () => {
    throwsInvalid(() => tool({ ...valid, inputSchema: { type: 'string' } }), /tool "lookup": inputSchema must describe an object/, /"string"/);
    throwsInvalid(() => tool({ ...valid, inputSchema: z.string() }), /tool "lookup": inputSchema must describe an object/);
    assert.equal(tool({ ...valid, inputSchema: { type: ['object', 'null'] } }).name, 'lookup');
    assert.equal(tool({ ...valid, inputSchema: { properties: { q: { type: 'string' } } } }).name, 'lookup');
  });

  test('other options of the wrong type', () => {
    throwsInvalid(() => tool({ ...valid, outputSchema: 'object' as never }), /tool "lookup": outputSchema/);
    throwsInvalid(() => tool({ ...valid, description: 7 as never }), /tool "lookup": description must be a string/);
    throwsInvalid(() => tool({ ...valid, needsApproval: 'yes' as never }), /tool "lookup": needsApproval/);
  });
});

describe('agent over the Anthropic Messages API', () => {
  test('uses tool_use blocks and finishes', async () => {
    server.reset();
    server.enqueue({ toolCalls: [{ name: 'get_weather', arguments: { city: 'Lima' } }] }, { text: 'Lima: 21.' });
    const agent = await createAgent({ model: anthropic({ baseURL: server.anthropicBaseURL, apiKey: 'k', model: 'claude' }), tools: [weather] });
    const res = await agent.run('Lima?');
    assert.equal(res.output, 'Lima: 21.');
    assert.equal(res.steps, 1);
  });
});

test('an aborted run keeps nothing of its provider failure once it has ended, however late the provider fails', async () => {
  const failures: WeakRef<object>[] = [];
  let failedLate!: () => void;
  const lateFailure = new Promise<void>((resolve) => (failedLate = resolve));
  const model: ModelProvider = {
    id: 'test-double:fails-after-the-abort',
    async *stream(_request, options) {
      // Like a fetch that sees the abort only after the run has ended.
      await new Promise<void>((resolve) => options?.signal?.addEventListener('abort', () => setTimeout(resolve, 20), { once: true }));
      const error = new Error('the request was aborted');
      failures.push(new WeakRef(error));
      setTimeout(failedLate, 0);
      throw error;
    },
  };
  const agent = await createAgent({ model });
  for (let i = 0; i < 3; i++) {
    const controller = new AbortController();
    const running = agent.run('hello', { signal: controller.signal });
    setTimeout(() => controller.abort(), 10);
    await assert.rejects(running, AbortError);
  }
  await lateFailure;
  await new Promise((resolve) => setTimeout(resolve, 50));
  await collectGarbage();
  assert.equal(failures.length, 3);
  assert.deepEqual(failures.map((f) => f.deref() === undefined), [true, true, true], 'the agent keeps no failure of an ended run');
  await agent.close();
});

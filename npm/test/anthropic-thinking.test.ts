/**
 * anthropic() with extended thinking, against a local server speaking the Messages API as the
 * real one does with thinking on (TEST DOUBLE: scripted answers, real HTTP and SSE): it signs
 * every thinking block it gives and answers 400, as the API does, when an assistant turn with
 * tool calls comes back without its thinking blocks first, with a block or a signature changed,
 * or with the blocks out of order; and when a thinking request carries a temperature, or a
 * `max_tokens` not above the budget.
 *
 * What the real API does here: https://docs.anthropic.com/en/docs/build-with-claude/extended-thinking
 * ("Preserving thinking blocks", "Extended thinking with tool use", "Interleaved thinking").
 */

import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import type { Server } from 'node:http';
import { after, before, beforeEach, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { CrucibleError } from '../src/errors.js';
import { anthropic, createAgent, memoryStore, tool, type AgentEvent } from '../src/node.js';
import type { AnthropicOptions, ChatMessage, ModelChunk, ModelProvider, ToolDefinition } from '../src/providers/types.js';
import { writeEvents } from './support/endless-stream.js';
import { toolResultsSoFar } from './support/anthropic-wire.js';
import { startJsonServer } from './support/json-server.js';

// ---------------------------------------------------------------------------------------------
// The server

/** A block the scripted model answers with; the server gives ids and signatures. */
type Scripted = { thinking: string } | { redacted: string } | { text: string } | { call: string; city: string };

interface WireBlock {
  type: string;
  [field: string]: unknown;
}
interface WireMessage {
  role: 'user' | 'assistant';
  content: string | WireBlock[];
}
interface WireBody {
  max_tokens: number;
  messages: WireMessage[];
  tools?: Array<{ name: string }>;
  tool_choice?: { type: string; name?: string };
  thinking?: { type: string; budget_tokens?: number; [field: string]: unknown };
  output_config?: { effort?: string };
  temperature?: number;
  stream?: boolean;
}

const SECRET = 'test-double-signing-key';
const sign = (thinking: string) => createHmac('sha256', SECRET).update(thinking).digest('base64');

let server: Server;
let baseURL = '';
const bodies: WireBody[] = [];
/** What the scripted model says to a request. */
let script: (body: WireBody) => Scripted[] = () => [{ text: 'Hello.' }];
/** Wait before each streamed event. */
let eventDelayMs = 0;
/** When it gives events, the server streams them instead, one at a time for as long as the
 *  client reads them; `written` then tells how many went out. */
let longAnswer: ((body: WireBody) => Iterable<[string, unknown]> | undefined) | undefined;
let written = Promise.resolve(0);
/** The thinking, redacted-thinking and tool_use blocks of every answer given, by its first call's id. */
const issued = new Map<string, WireBlock[]>();
let ids = 0;

/** Why the real API would refuse `body`, in its words, or `undefined`. */
function refusal(body: WireBody): string | undefined {
  const thinking = body.thinking?.type === 'enabled' || body.thinking?.type === 'adaptive';
  if (body.thinking?.type === 'enabled') {
    const budget = body.thinking.budget_tokens ?? 0;
    if (budget < 1024) return 'thinking.enabled.budget_tokens: Input should be greater than or equal to 1024';
    if (body.max_tokens <= budget) return '`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking#max-tokens-and-context-window-size';
  }
  // Adaptive thinking takes its type and `display` only; the effort goes in `output_config`.
  if (body.thinking?.type === 'adaptive') {
    const extra = Object.keys(body.thinking).find((field) => field !== 'type' && field !== 'display');
    if (extra) return `thinking.adaptive.${extra}: Extra inputs are not permitted`;
  }
  const effort = body.output_config?.effort;
  if (effort !== undefined && !['low', 'medium', 'high', 'xhigh', 'max'].includes(effort)) return "output_config.effort: Input should be 'low', 'medium', 'high', 'xhigh' or 'max'";
  if (thinking && body.temperature !== undefined && body.temperature !== 1) {
    return '`temperature` may only be set to 1 when thinking is enabled. Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking#feature-compatibility';
  }
  for (const [m, message] of body.messages.entries()) {
    if (message.role !== 'assistant' || typeof message.content === 'string') continue;
    const calls = message.content.filter((b) => b.type === 'tool_use');
    if (calls.length === 0) continue;
    const first = message.content[0]!;
    if (thinking && first.type !== 'thinking' && first.type !== 'redacted_thinking') {
      return `messages.${m}.content.0.type: Expected \`thinking\` or \`redacted_thinking\`, but found \`${first.type}\`. When \`thinking\` is enabled, a final \`assistant\` message must start with a thinking block (preceeding the lastmost set of \`tool_use\` and \`tool_result\` blocks). We recommend you include thinking blocks from previous turns. To avoid this requirement, disable \`thinking\`. Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking`;
    }
    for (const [b, block] of message.content.entries()) {
      if (block.type === 'thinking' && block.signature !== sign(String(block.thinking))) return `messages.${m}.content.${b}: Invalid \`signature\` in \`thinking\` block`;
    }
    // The blocks the model gave, in the order it gave them: rearranged, left out or changed
    // (a redacted block's data among them), the turn is refused.
    const given = issued.get(String(calls[0]!.id));
    const sent = message.content.filter((b) => b.type !== 'text');
    if (given && JSON.stringify(sent) !== JSON.stringify(given)) {
      return `messages.${m}.content: \`thinking\` or \`redacted_thinking\` blocks in the latest assistant message cannot be modified. These blocks must remain as they were in the original response.`;
    }
  }
  return undefined;
}

/** The content blocks of an answer, as the API gives them whole. */
function answerBlocks(scripted: Scripted[]): WireBlock[] {
  const blocks = scripted.map((s): WireBlock => {
    if ('thinking' in s) return { type: 'thinking', thinking: s.thinking, signature: sign(s.thinking) };
    if ('redacted' in s) return { type: 'redacted_thinking', data: s.redacted };
    if ('text' in s) return { type: 'text', text: s.text };
    return { type: 'tool_use', id: `toolu_${++ids}_${s.city}`, name: s.call, input: { city: s.city } };
  });
  const firstCall = blocks.find((b) => b.type === 'tool_use');
  if (firstCall) issued.set(String(firstCall.id), blocks.filter((b) => b.type !== 'text'));
  return blocks;
}

/** The SSE events of an answer, as the API streams them: a thinking block's text in
 *  `thinking_delta`s and its signature in one `signature_delta` before its stop; a redacted
 *  block whole at its start; a tool's input as `input_json_delta`s after an empty `input`. */
function answerEvents(blocks: WireBlock[], stopReason: string): Array<[string, unknown]> {
  const events: Array<[string, unknown]> = [
    ['message_start', { type: 'message_start', message: { id: `msg_${++ids}`, type: 'message', role: 'assistant', model: 'claude-sonnet-4-5', content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 20, output_tokens: 1 } } }],
  ];
  const delta = (index: number, d: unknown): [string, unknown] => ['content_block_delta', { type: 'content_block_delta', index, delta: d }];
  for (const [index, block] of blocks.entries()) {
    const start = (content_block: unknown): [string, unknown] => ['content_block_start', { type: 'content_block_start', index, content_block }];
    if (block.type === 'thinking') {
      const text = String(block.thinking);
      const half = Math.ceil(text.length / 2);
      events.push(start({ type: 'thinking', thinking: '', signature: '' }), delta(index, { type: 'thinking_delta', thinking: text.slice(0, half) }), delta(index, { type: 'thinking_delta', thinking: text.slice(half) }));
      events.push(delta(index, { type: 'signature_delta', signature: block.signature }));
    } else if (block.type === 'redacted_thinking') {
      events.push(start(block));
    } else if (block.type === 'text') {
      events.push(start({ type: 'text', text: '' }), delta(index, { type: 'text_delta', text: block.text }));
    } else {
      const input = JSON.stringify(block.input);
      events.push(start({ ...block, input: {} }), delta(index, { type: 'input_json_delta', partial_json: input.slice(0, 5) }), delta(index, { type: 'input_json_delta', partial_json: input.slice(5) }));
    }
    events.push(['content_block_stop', { type: 'content_block_stop', index }]);
  }
  events.push(['message_delta', { type: 'message_delta', delta: { stop_reason: stopReason, stop_sequence: null }, usage: { output_tokens: 30 } }], ['message_stop', { type: 'message_stop' }]);
  return events;
}

before(async () => {
  ({ server, origin: baseURL } = await startJsonServer<WireBody>(async (body, res) => {
    bodies.push(body);
    const long = longAnswer?.(body);
    if (long) {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const events = function* () {
        for (const [event, data] of long) yield `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`;
      };
      written = writeEvents(res, events());
      return;
    }
    const refused = refusal(body);
    if (refused) {
      res.writeHead(400, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ type: 'error', error: { type: 'invalid_request_error', message: refused } }));
      return;
    }
    const blocks = answerBlocks(script(body));
    const stopReason = blocks.some((b) => b.type === 'tool_use') ? 'tool_use' : 'end_turn';
    if (!body.stream) {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ id: `msg_${++ids}`, type: 'message', role: 'assistant', model: 'claude-sonnet-4-5', content: blocks, stop_reason: stopReason, stop_sequence: null, usage: { input_tokens: 20, output_tokens: 30 } }));
      return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    for (const [event, data] of answerEvents(blocks, stopReason)) {
      if (eventDelayMs > 0) await sleep(eventDelayMs);
      res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
    }
    res.end();
  }));
});
after(() => new Promise<void>((resolve) => server.close(() => resolve())));
beforeEach(() => {
  bodies.length = 0;
  eventDelayMs = 0;
  longAnswer = undefined;
});

// ---------------------------------------------------------------------------------------------
// Helpers

const weatherTool: ToolDefinition = {
  name: 'get_weather',
  description: 'Current weather for a city',
  inputSchema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
};

/** Oslo first, then Lima, then the answer, with thinking at every turn; `turns` replaces the
 *  scripted blocks of a turn. */
function weatherScript(turns: Partial<Record<number, Scripted[]>> = {}): (body: WireBody) => Scripted[] {
  const plain: Record<number, Scripted[]> = {
    0: [{ thinking: 'The user wants Oslo first, then Lima.' }, { text: 'Looking up Oslo.' }, { call: 'get_weather', city: 'Oslo' }],
    1: [{ thinking: 'Oslo is 21C. Now Lima.' }, { call: 'get_weather', city: 'Lima' }],
    2: [{ thinking: 'Both are known.' }, { text: 'Both 21C.' }],
  };
  return (body) => {
    const done = toolResultsSoFar(body);
    return turns[done] ?? plain[done] ?? [{ text: 'Done.' }];
  };
}

function model(options: Partial<AnthropicOptions> = {}): ModelProvider {
  return anthropic({ baseURL, apiKey: 'k', model: 'claude-sonnet-4-5', thinking: { budgetTokens: 2048 }, retry: { maxRetries: 0 }, ...options });
}

/** An agent with a weather tool that answers 21C; the cities it was asked for, and the text
 *  deltas a run streams. */
async function weatherAgent(options: Partial<AnthropicOptions> = {}) {
  const cities: string[] = [];
  const weather = tool({ ...weatherTool, execute: ({ city }: { city: string }) => (cities.push(city), '21C') });
  const agent = await createAgent({ model: model(options), tools: [weather] });
  async function run(input: string): Promise<{ text: string; deltas: string }> {
    let deltas = '';
    let end: Extract<AgentEvent, { type: 'agent.end' }> | undefined;
    for await (const event of agent.stream(input)) {
      if (event.type === 'text.delta') deltas += event.delta;
      if (event.type === 'agent.error') throw new Error(`${event.error.code}: ${event.error.message}`);
      if (event.type === 'agent.end') end = event;
    }
    assert.ok(end, 'the run ended');
    return { text: end.text, deltas };
  }
  return { cities, run };
}

/** The assistant messages with tool calls of a request, as the types of their blocks. */
function toolTurns(body: WireBody): string[][] {
  return body.messages
    .filter((m) => m.role === 'assistant' && typeof m.content !== 'string' && m.content.some((b) => b.type === 'tool_use'))
    .map((m) => (m.content as WireBlock[]).map((b) => b.type));
}

interface Call {
  id?: string;
  name: string;
  arguments: string;
  providerData?: unknown;
}

/** Folds a provider's chunks as the core does: calls by index, the last `providerData` kept. */
async function collect(stream: AsyncIterable<ModelChunk>): Promise<{ text: string; calls: Call[] }> {
  let text = '';
  const calls: Call[] = [];
  for await (const chunk of stream) {
    if (chunk.type === 'text') text += chunk.delta;
    if (chunk.type !== 'tool_call') continue;
    const call = (calls[chunk.index] ??= { name: '', arguments: '' });
    if (chunk.id) call.id = chunk.id;
    if (chunk.name) call.name += chunk.name;
    call.arguments += chunk.argumentsDelta;
    if (chunk.providerData !== undefined) call.providerData = chunk.providerData;
  }
  return { text, calls };
}

// ---------------------------------------------------------------------------------------------
// Tests

describe('anthropic(): extended thinking through a tool loop', () => {
  it('an agent runs two tool turns with thinking on, streamed and whole: each tool turn goes back with its signed thinking first, and no thinking is text', async () => {
    for (const stream of [true, false]) {
      bodies.length = 0;
      script = weatherScript();
      const { cities, run } = await weatherAgent({ stream });
      const { text, deltas } = await run('Weather in Oslo, then in Lima?');
      assert.equal(text, 'Both 21C.', `stream: ${stream}`);
      assert.deepEqual(cities, ['Oslo', 'Lima']);
      assert.equal(deltas, 'Looking up Oslo.Both 21C.', 'text deltas carry the answers only, never thinking');
      const last = bodies.at(-1)!;
      assert.equal(bodies.length, 3);
      // The first call's thinking comes before the turn's text, as the API wants it to start.
      assert.deepEqual(toolTurns(last), [['thinking', 'text', 'tool_use'], ['thinking', 'tool_use']]);
      const firstTurn = last.messages[1]!.content as WireBlock[];
      assert.deepEqual(firstTurn[0], { type: 'thinking', thinking: 'The user wants Oslo first, then Lima.', signature: sign('The user wants Oslo first, then Lima.') });
    }
  });

  it('redacted_thinking blocks go back with their data, in their place among the thinking blocks', async () => {
    const data = 'EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpPkNRj2YfWXGmKDxH4mPnZ5sQ7vB5URj';
    for (const stream of [true, false]) {
      bodies.length = 0;
      script = weatherScript({ 0: [{ redacted: data }, { thinking: 'Oslo first.' }, { redacted: `${data}2` }, { call: 'get_weather', city: 'Oslo' }] });
      const { run } = await weatherAgent({ stream });
      assert.equal((await run('Weather in Oslo, then in Lima?')).text, 'Both 21C.', `stream: ${stream}`);
      const sent = bodies.at(-1)!.messages[1]!.content as WireBlock[];
      assert.deepEqual(sent.slice(0, 3), [
        { type: 'redacted_thinking', data },
        { type: 'thinking', thinking: 'Oslo first.', signature: sign('Oslo first.') },
        { type: 'redacted_thinking', data: `${data}2` },
      ]);
    }
  });

  it('interleaved thinking: blocks between two calls are the second call\'s, and go back between the calls', async () => {
    const interleaved: Scripted[] = [{ thinking: 'Oslo first.' }, { call: 'get_weather', city: 'Oslo' }, { thinking: 'And Lima at once.' }, { redacted: 'opaque' }, { call: 'get_weather', city: 'Lima' }];
    script = () => interleaved;
    const out = await collect(model().stream({ messages: [{ role: 'user', content: 'Weather in Oslo and Lima?' }], tools: [weatherTool] }));
    assert.deepEqual(
      out.calls.map((call) => call.providerData),
      [
        { thinking: [{ type: 'thinking', thinking: 'Oslo first.', signature: sign('Oslo first.') }] },
        { thinking: [{ type: 'thinking', thinking: 'And Lima at once.', signature: sign('And Lima at once.') }, { type: 'redacted_thinking', data: 'opaque' }] },
      ],
    );

    for (const stream of [true, false]) {
      bodies.length = 0;
      script = weatherScript({ 0: interleaved, 1: [{ text: 'Both 21C.' }] });
      const { cities, run } = await weatherAgent({ stream });
      assert.equal((await run('Weather in Oslo and Lima?')).text, 'Both 21C.', `stream: ${stream}`);
      assert.deepEqual(cities, ['Oslo', 'Lima']);
      assert.deepEqual(toolTurns(bodies.at(-1)!), [['thinking', 'tool_use', 'thinking', 'redacted_thinking', 'tool_use']]);
    }
  });

  it('a thinking phase longer than timeoutMs, with no text, is not cut off: thinking deltas are progress', async () => {
    // 2 blocks of 4 deltas each (start, 2 thinking, signature) and a call: about 600 ms of
    // events 50 ms apart, three times the stall timeout.
    eventDelayMs = 50;
    script = () => [{ thinking: 'A long first thought.' }, { thinking: 'And a second one.' }, { call: 'get_weather', city: 'Oslo' }];
    const out = await collect(model({ timeoutMs: 200 }).stream({ messages: [{ role: 'user', content: 'Weather in Oslo?' }], tools: [weatherTool] }));
    assert.equal(out.text, '');
    assert.equal(out.calls.length, 1);
    assert.deepEqual(out.calls[0]!.providerData, {
      thinking: [
        { type: 'thinking', thinking: 'A long first thought.', signature: sign('A long first thought.') },
        { type: 'thinking', thinking: 'And a second one.', signature: sign('And a second one.') },
      ],
    });
  });

  it("a call's providerData that is not this provider's (another provider's, or edited) is left out; this provider's goes back", async () => {
    script = () => [{ text: 'ok' }];
    const signed = { type: 'thinking', thinking: 'Mine.', signature: sign('Mine.') };
    const toolCalls = [
      { id: 'a', name: 'get_weather', arguments: '{}', providerData: { thinking: [signed] } },
      { id: 'b', name: 'get_weather', arguments: '{}', providerData: { reasoning_content: 'DeepSeek reasoning' } },
      { id: 'c', name: 'get_weather', arguments: '{}', providerData: 'opaque' },
      { id: 'd', name: 'get_weather', arguments: '{}', providerData: { thinking: [{ type: 'thinking', thinking: 7 }] } },
      { id: 'e', name: 'get_weather', arguments: '{}', providerData: { thinking: [{ type: 'redacted_thinking', data: 'x' }, { type: 'image' }] } },
      { id: 'f', name: 'get_weather', arguments: '{}', providerData: { extra_content: { google: { thought_signature: 'sig' } } } },
    ];
    const messages: ChatMessage[] = [
      { role: 'user', content: 'Weather?' },
      { role: 'assistant', content: '', toolCalls },
      ...toolCalls.map((call): ChatMessage => ({ role: 'tool', toolCallId: call.id, name: call.name, content: '21C' })),
    ];
    // Not a thinking request: the server checks signatures but does not ask for thinking first.
    await collect(model({ thinking: undefined, stream: false }).stream({ messages, tools: [weatherTool] }));
    const sent = bodies.at(-1)!.messages[1]!.content as WireBlock[];
    assert.deepEqual(sent.map((b) => b.type), ['thinking', 'tool_use', 'tool_use', 'tool_use', 'tool_use', 'tool_use', 'tool_use']);
    assert.deepEqual(sent[0], signed);
  });

  it('blocks go back exactly as stored, never remade: a changed signature is refused by the server with 400', async () => {
    const thought = 'Oslo first.';
    const turn = (providerData: unknown): ChatMessage[] => [
      { role: 'user', content: 'Weather in Oslo?' },
      { role: 'assistant', content: '', toolCalls: [{ id: 'toolu_x', name: 'get_weather', arguments: '{"city":"Oslo"}', providerData }] },
      { role: 'tool', toolCallId: 'toolu_x', name: 'get_weather', content: '21C' },
    ];
    script = () => [{ text: 'ok' }];
    const good = { thinking: [{ type: 'thinking', thinking: thought, signature: sign(thought) }] };
    assert.equal((await collect(model().stream({ messages: turn(good), tools: [weatherTool] }))).text, 'ok');
    const tampered = { thinking: [{ type: 'thinking', thinking: thought, signature: sign('Lima first.') }] };
    await assert.rejects(collect(model().stream({ messages: turn(tampered), tools: [weatherTool] })), (error: unknown) => {
      assert.ok(error instanceof CrucibleError, String(error));
      assert.equal((error as CrucibleError & { status?: number }).status, 400);
      assert.match(error.message, /Invalid `signature` in `thinking` block/);
      return true;
    });
  });

  it('thinking streamed past 8 MiB fails the run as provider_protocol then, long before the server would stop, and the agent serves on', async () => {
    // 64 MiB of thinking (128 times the bound) a KiB a delta, then the block's signature and a call.
    const deltas = 65_536;
    let long = true;
    longAnswer = () => {
      if (!long) return undefined;
      const [messageStart, thinkingStart, ...rest] = answerEvents(answerBlocks([{ thinking: '' }, { call: 'get_weather', city: 'Oslo' }]), 'tool_use');
      return (function* () {
        yield messageStart!;
        yield thinkingStart!;
        for (let n = 0; n < deltas; n++) yield ['content_block_delta', { type: 'content_block_delta', index: 0, delta: { type: 'thinking_delta', thinking: `${n} `.padEnd(1024, 'x') } }];
        yield* rest;
      })();
    };
    script = weatherScript();
    const { cities, run } = await weatherAgent();
    const error = await run('Weather in Oslo, then in Lima?').then(
      () => assert.fail('the run did not fail'),
      (e: unknown) => e as Error,
    );
    // The client stopped reading at the bound; what the socket buffers held is the rest.
    const events = await written;
    assert.ok(events < deltas / 4, `the server wrote ${events} of its ${deltas + 12} events`);
    assert.match(error.message, /^provider_protocol: .*the model's response streamed more than 8388608 bytes of reasoning/);
    assert.deepEqual(cities, []);

    long = false;
    assert.equal((await run('Weather in Oslo, then in Lima?')).text, 'Both 21C.');
    assert.deepEqual(cities, ['Oslo', 'Lima']);
  });

  it('thinking past 512 KiB fails the run when a call that needs it starts, and a final answer with as much thinking completes', async () => {
    const long = 'x'.repeat(600 * 1024);
    script = weatherScript({ 0: [{ thinking: long }, { call: 'get_weather', city: 'Oslo' }] });
    const first = await weatherAgent();
    await assert.rejects(first.run('Weather in Oslo, then in Lima?'), /provider_protocol: .*thinking blocks took the model's response past 524288 bytes of provider data to send back; at most 524288 are kept/);
    assert.deepEqual(first.cities, []);
    // Nothing sends a final answer's thinking back: it is dropped, not a failure.
    script = () => [{ thinking: long }, { text: 'Thought long; no tool needed.' }];
    const second = await weatherAgent();
    assert.equal((await second.run('Anything?')).text, 'Thought long; no tool needed.');
  });

  it('a run paused for approval after a thinking turn resumes in a new agent, with a new provider object, and sends the thinking back', async () => {
    script = weatherScript();
    const store = memoryStore();
    const weather = tool({ ...weatherTool, needsApproval: ({ city }: { city: string }) => city === 'Oslo', execute: () => '21C' });
    // Each "process" has its own agent and its own provider object; only the store is shared.
    const agent = () => createAgent({ model: model(), tools: [weather], store });
    const paused = await (await agent()).run('Weather in Oslo, then in Lima?');
    assert.equal(paused.status, 'paused');
    const resumed = await (await agent()).resume(paused.runId, { approvals: paused.pendingApprovals.map(({ id }) => ({ id, approved: true })) });
    assert.equal(resumed.status, 'completed');
    assert.equal(resumed.text, 'Both 21C.');
    const first = bodies[1]!.messages[1]!.content as WireBlock[];
    assert.deepEqual(first[0], { type: 'thinking', thinking: 'The user wants Oslo first, then Lima.', signature: sign('The user wants Oslo first, then Lima.') });
  });
});

describe('anthropic({ thinking: { budgetTokens } })', () => {
  it('asks for thinking with that budget, keeps the answer\'s token limit above it, and sends no temperature', async () => {
    script = () => [{ thinking: 'Short.' }, { text: 'Hi.' }];
    const request = { messages: [{ role: 'user' as const, content: 'Hi' }], tools: [], temperature: 0 };
    assert.equal((await collect(model().stream(request))).text, 'Hi.');
    assert.equal((await collect(model().stream({ ...request, maxTokens: 512 }))).text, 'Hi.');
    assert.deepEqual(
      bodies.map(({ thinking, max_tokens, temperature }) => ({ thinking, max_tokens, temperature })),
      [
        { thinking: { type: 'enabled', budget_tokens: 2048 }, max_tokens: 4096 + 2048, temperature: undefined },
        { thinking: { type: 'enabled', budget_tokens: 2048 }, max_tokens: 512 + 2048, temperature: undefined },
      ],
    );
    // Without the option, nothing changes.
    await collect(model({ thinking: undefined }).stream({ ...request, maxTokens: 512 }));
    assert.deepEqual([bodies.at(-1)!.thinking, bodies.at(-1)!.max_tokens, bodies.at(-1)!.temperature], [undefined, 512, 0]);
  });

  it('extraBody.thinking still works, and replaces what the option sends', async () => {
    script = weatherScript();
    const { run } = await weatherAgent({ thinking: undefined, extraBody: { thinking: { type: 'enabled', budget_tokens: 1024 } } });
    assert.equal((await run('Weather in Oslo, then in Lima?')).text, 'Both 21C.');
    assert.deepEqual(bodies.at(-1)!.thinking, { type: 'enabled', budget_tokens: 1024 });

    await collect(model({ extraBody: { thinking: { type: 'enabled', budget_tokens: 3000 } } }).stream({ messages: [{ role: 'user', content: 'Hi' }], tools: [] }));
    assert.deepEqual([bodies.at(-1)!.thinking, bodies.at(-1)!.max_tokens], [{ type: 'enabled', budget_tokens: 3000 }, 4096 + 2048]);
  });

  it('on through the option or extraBody, no temperature is sent and no tool choice forces a call (the API refuses both with thinking on)', async () => {
    script = () => [{ text: 'Hi.' }];
    const messages = [{ role: 'user' as const, content: 'Hi' }];
    const schema = { type: 'object', properties: {} };
    const tools = [
      { name: 'get_weather', description: 'Weather', inputSchema: schema },
      { name: 'get_time', description: 'Time', inputSchema: schema },
    ];
    const sent = () => ({ choice: bodies.at(-1)!.tool_choice, tools: bodies.at(-1)!.tools?.map((t) => t.name), temperature: bodies.at(-1)!.temperature });
    for (const thinkingModel of [model(), model({ thinking: undefined, extraBody: { thinking: { type: 'enabled', budget_tokens: 1024 } } })]) {
      await collect(thinkingModel.stream({ messages, tools, temperature: 0, toolChoice: 'required' }));
      assert.deepEqual(sent(), { choice: { type: 'auto' }, tools: ['get_weather', 'get_time'], temperature: undefined });
      await collect(thinkingModel.stream({ messages, tools, toolChoice: { tool: 'get_time' } }));
      assert.deepEqual(sent(), { choice: { type: 'auto' }, tools: ['get_time'], temperature: undefined }, 'the named tool is the only one offered');
      await collect(thinkingModel.stream({ messages, tools, toolChoice: 'none' }));
      assert.deepEqual(sent().choice, { type: 'none' });
    }
    // Without thinking, choices force as asked.
    await collect(model({ thinking: undefined }).stream({ messages, tools, temperature: 0, toolChoice: { tool: 'get_time' } }));
    assert.deepEqual(sent(), { choice: { type: 'tool', name: 'get_time' }, tools: ['get_weather', 'get_time'], temperature: 0 });
    await collect(model({ thinking: undefined, extraBody: { thinking: { type: 'disabled' } } }).stream({ messages, tools, toolChoice: 'required' }));
    assert.deepEqual(sent().choice, { type: 'any' });
  });

  it('is checked when the provider is created: anything but a whole budget of at least 1024 tokens, or the adaptive form, is invalid_config', () => {
    const cases: Array<[unknown, RegExp]> = [
      [true, /`thinking` must be \{ budgetTokens \} \(a whole number of tokens, at least 1024\) or \{ type: 'adaptive' \} \(got true\)/],
      ['adaptive', /`thinking` must be \{ budgetTokens \}/],
      [4096, /`thinking` must be \{ budgetTokens \}/],
      ...[{}, { budgetTokens: 1023 }, { budgetTokens: 2048.5 }, { budgetTokens: '2048' }, { budget_tokens: 2048 }, { budgetTokens: Number.POSITIVE_INFINITY }].map(
        (thinking): [unknown, RegExp] => [thinking, /`thinking\.budgetTokens` must be a whole number of tokens, at least 1024/],
      ),
      [{ type: 'enabled', budgetTokens: 2048 }, /`thinking\.type` must be 'adaptive' \(or left out, with budgetTokens\) \(got "enabled"\)/],
      [{ type: 'adaptive', budgetTokens: 2048 }, /`thinking\.budgetTokens` must be left out: adaptive thinking takes `effort` only \(got 2048\)/],
      [{ type: 'adaptive', display: 'omitted' }, /`thinking\.display` must be left out/],
      [{ type: 'adaptive', effort: 'extreme' }, /`thinking\.effort` must be one of 'low', 'medium', 'high', 'xhigh', 'max' \(got "extreme"\)/],
      [{ type: 'adaptive', effort: 3 }, /`thinking\.effort` must be one of/],
    ];
    for (const [thinking, message] of cases) {
      assert.throws(
        () => anthropic({ model: 'claude-sonnet-4-5', thinking } as unknown as AnthropicOptions),
        (error: unknown) => error instanceof CrucibleError && error.code === 'invalid_config' && /^anthropic\(\): /.test(error.message) && message.test(error.message),
        JSON.stringify(thinking),
      );
    }
    assert.doesNotThrow(() => anthropic({ model: 'm', thinking: { budgetTokens: 1024 } }));
    assert.doesNotThrow(() => anthropic({ model: 'm', thinking: null } as unknown as AnthropicOptions));
    assert.doesNotThrow(() => anthropic({ model: 'm', thinking: { type: 'adaptive' } }));
    assert.doesNotThrow(() => anthropic({ model: 'm', thinking: { type: 'adaptive', effort: null } } as unknown as AnthropicOptions));
    for (const effort of ['low', 'medium', 'high', 'xhigh', 'max'] as const) assert.doesNotThrow(() => anthropic({ model: 'm', thinking: { type: 'adaptive', effort } }));
  });
});

describe("anthropic({ thinking: { type: 'adaptive', effort } })", () => {
  it('asks for adaptive thinking and the effort, keeps the request\'s own token limit, and sends no temperature', async () => {
    script = () => [{ thinking: 'Short.' }, { text: 'Hi.' }];
    const request = { messages: [{ role: 'user' as const, content: 'Hi' }], tools: [], temperature: 0 };
    const adaptive = (effort?: 'low' | 'max') => model({ model: 'claude-opus-4-6', thinking: { type: 'adaptive', ...(effort && { effort }) } });
    assert.equal((await collect(adaptive('low').stream(request))).text, 'Hi.');
    assert.equal((await collect(adaptive('max').stream({ ...request, maxTokens: 16_000 }))).text, 'Hi.');
    assert.equal((await collect(adaptive().stream(request))).text, 'Hi.');
    assert.deepEqual(
      bodies.map(({ thinking, output_config, max_tokens, temperature }) => ({ thinking, output_config, max_tokens, temperature })),
      [
        { thinking: { type: 'adaptive' }, output_config: { effort: 'low' }, max_tokens: 4096, temperature: undefined },
        { thinking: { type: 'adaptive' }, output_config: { effort: 'max' }, max_tokens: 16_000, temperature: undefined },
        // Without an effort the API's default applies.
        { thinking: { type: 'adaptive' }, output_config: undefined, max_tokens: 4096, temperature: undefined },
      ],
    );
  });

  it('an agent runs a tool loop with it, streamed and whole: thinking between the calls (adaptive thinking interleaves) goes back between them, signed and in order', async () => {
    const interleaved: Scripted[] = [{ thinking: 'Oslo first.' }, { text: 'Looking up Oslo.' }, { call: 'get_weather', city: 'Oslo' }, { thinking: 'And Lima at once.' }, { redacted: 'opaque' }, { call: 'get_weather', city: 'Lima' }];
    for (const stream of [true, false]) {
      bodies.length = 0;
      script = weatherScript({ 0: interleaved, 2: [{ thinking: 'Both are known.' }, { text: 'Both 21C.' }] });
      const { cities, run } = await weatherAgent({ model: 'claude-opus-4-6', thinking: { type: 'adaptive', effort: 'medium' }, stream });
      const { text, deltas } = await run('Weather in Oslo and Lima?');
      assert.equal(text, 'Both 21C.', `stream: ${stream}`);
      assert.equal(deltas, 'Looking up Oslo.Both 21C.', 'thinking is never text');
      assert.deepEqual(cities, ['Oslo', 'Lima']);
      assert.equal(bodies.length, 2);
      for (const body of bodies) assert.deepEqual([body.thinking, body.output_config], [{ type: 'adaptive' }, { effort: 'medium' }]);
      const turn = bodies[1]!.messages[1]!.content as WireBlock[];
      assert.deepEqual(turn.map((b) => b.type), ['thinking', 'text', 'tool_use', 'thinking', 'redacted_thinking', 'tool_use']);
      assert.deepEqual(turn[3], { type: 'thinking', thinking: 'And Lima at once.', signature: sign('And Lima at once.') });
    }
  });

  it('extraBody.thinking and extraBody.output_config still replace what the option sends', async () => {
    script = () => [{ text: 'Hi.' }];
    const request = { messages: [{ role: 'user' as const, content: 'Hi' }], tools: [] };
    await collect(model({ thinking: { type: 'adaptive', effort: 'low' }, extraBody: { thinking: { type: 'adaptive', display: 'omitted' }, output_config: { effort: 'high' } } }).stream(request));
    assert.deepEqual([bodies.at(-1)!.thinking, bodies.at(-1)!.output_config], [{ type: 'adaptive', display: 'omitted' }, { effort: 'high' }]);
  });
});

/**
 * anthropic() with prompt caching, against a local server speaking the Messages API (JSON and
 * SSE) with a small in-memory emulation of the API's prompt cache: a TEST DOUBLE, scripted
 * answers over real HTTP. Like the API it refuses with 400 a request with more than 4
 * `cache_control` blocks, one on an empty text or a thinking block, and a `ttl` it does not
 * know; and it reads a request's prefix from the cache when, looking back at most 20 blocks
 * from one of its breakpoints, it finds a prefix an earlier request wrote at a breakpoint of its
 * own, reporting `cache_read_input_tokens` and `cache_creation_input_tokens` beside
 * `input_tokens` (only the tokens after the last breakpoint), as the API does.
 *
 * What the real API does here: https://platform.claude.com/docs/en/build-with-claude/prompt-caching
 * ("How automatic prefix checking works", "Cache limitations", "What can be cached", "What
 * cannot be cached", "Tracking cache performance").
 */

import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import type { Server } from 'node:http';
import { after, before, beforeEach, describe, it } from 'node:test';
import { CrucibleError } from '../src/errors.js';
import { anthropic, createAgent, memoryStore, tool, type AgentEvent, type RunUsage } from '../src/node.js';
import type { AnthropicOptions, ChatMessage, ModelChunk, ModelProvider, ModelRequest, ToolDefinition } from '../src/providers/types.js';
import { SLUGIFY_FORGE } from './support/forge-fixtures.js';
import { toolResultsSoFar } from './support/anthropic-wire.js';
import { startJsonServer } from './support/json-server.js';

// ---------------------------------------------------------------------------------------------
// The server

interface WireBlock {
  type: string;
  text?: string;
  cache_control?: { type: string; ttl?: string };
  [field: string]: unknown;
}
interface WireMessage {
  role: 'user' | 'assistant';
  content: string | WireBlock[];
}
interface WireTool {
  name: string;
  cache_control?: { type: string; ttl?: string };
  [field: string]: unknown;
}
interface WireBody {
  model: string;
  system?: string | WireBlock[];
  tools?: WireTool[];
  tool_choice?: unknown;
  thinking?: unknown;
  messages: WireMessage[];
  cache_control?: { type: string; ttl?: string };
  stream?: boolean;
}

/** The usage the server reported for a request. */
interface CacheUsage {
  input_tokens: number;
  cache_creation_input_tokens: number;
  cache_read_input_tokens: number;
  output_tokens: number;
}

/** A block the scripted model answers with. */
type Scripted = { text: string } | { call: string; input: Record<string, unknown> };

/** The least prefix the emulation caches, as Claude Sonnet 4.5 does ("Cache limitations"). */
const MIN_CACHEABLE_TOKENS = 1024;
/** "The automatic prefix checking only looks back approximately 20 content blocks". */
const LOOKBACK_BLOCKS = 20;
const OUTPUT_TOKENS = 12;

let server: Server;
let baseURL = '';
/** Every request body, as sent, and the usage reported for it (`undefined`: refused). */
const received: Array<{ raw: string; body: WireBody; usage?: CacheUsage; breakpointTokens: number[] }> = [];
/** Prefixes written to the emulated cache, by hash: their length in tokens. */
const cache = new Map<string, number>();
let script: (body: WireBody) => Scripted[] = () => [{ text: 'Hello.' }];
let ids = 0;

/** The request as the cache sees it: one entry per block, in the API's order (tools, system,
 *  messages), each with where it is and whether it carries a breakpoint. A string content is
 *  the one text block it stands for ("shorthand for an array of one content block of type
 *  text", Messages API), so marking it as a block does not change the prefix. */
function blocksOf(body: WireBody): Array<{ path: string; key: string; block: Record<string, unknown> }> {
  const out: Array<{ path: string; key: string; block: Record<string, unknown> }> = [];
  const add = (path: string, prefix: string, block: Record<string, unknown>) => {
    const { cache_control: _control, ...content } = block;
    out.push({ path, key: `${prefix}${JSON.stringify(content)}`, block });
  };
  for (const [t, tool] of (body.tools ?? []).entries()) add(`tools.${t}`, 'tool:', tool);
  const system = typeof body.system === 'string' ? [{ type: 'text', text: body.system }] : (body.system ?? []);
  for (const [s, block] of system.entries()) add(`system.${s}`, 'system:', block);
  for (const [m, message] of body.messages.entries()) {
    const content = typeof message.content === 'string' ? [{ type: 'text', text: message.content }] : message.content;
    // tool_choice and thinking settings change the messages' cache, not the tools' or system's
    // ("What invalidates the cache"): they are part of each message block's prefix.
    const settings = JSON.stringify([body.tool_choice ?? null, body.thinking ?? null]);
    for (const [b, block] of content.entries()) add(`messages.${m}.content.${b}`, `${message.role}:${settings}:`, block);
  }
  return out;
}

const tokensOf = (key: string) => Math.ceil(key.length / 4);

/** Why the real API would refuse `body`'s breakpoints, in its words, or `undefined`. */
function refusal(body: WireBody): string | undefined {
  const blocks = blocksOf(body);
  const marked = blocks.filter(({ block }) => block.cache_control != null);
  const count = marked.length + (body.cache_control ? 1 : 0);
  if (count > 4) return `A maximum of 4 blocks with cache_control may be provided. Found ${count}.`;
  let longest: string | undefined;
  for (const { path, block } of marked) {
    if (block.type === 'thinking' || block.type === 'redacted_thinking') return `${path}.${block.type}.cache_control: Extra inputs are not permitted`;
    if (block.type === 'text' && !String(block.text ?? '').trim()) return `${path}.text: cache_control cannot be set for empty text blocks`;
    const control = block.cache_control as { type?: unknown; ttl?: unknown };
    if (control.type !== 'ephemeral') return `${path}.cache_control.type: Input should be 'ephemeral'`;
    if (control.ttl !== undefined && control.ttl !== '5m' && control.ttl !== '1h') return `${path}.cache_control.ttl: Input should be '5m' or '1h'`;
    // "Cache entries with longer TTL must appear before shorter TTLs" (the wording is ours).
    const ttl = (control.ttl as string | undefined) ?? '5m';
    if (ttl === '1h' && longest === '5m') return `${path}.cache_control: a ttl='1h' breakpoint must not come after a ttl='5m' one`;
    longest = ttl;
  }
  return undefined;
}

/** Reads and writes the emulated cache for `body` and says what its usage is: the longest
 *  prefix cached at a block at most 20 before one of its breakpoints is read; the prefix up to
 *  each breakpoint past it, long enough to cache, is written. */
function account(body: WireBody): { usage: CacheUsage; breakpointTokens: number[] } {
  const blocks = blocksOf(body);
  const hashes: string[] = [];
  const ends: number[] = [];
  let hash = createHash('sha256').update(body.model).digest('hex');
  let tokens = 0;
  for (const { key } of blocks) {
    hash = createHash('sha256').update(hash).update(key).digest('hex');
    tokens += tokensOf(key);
    hashes.push(hash);
    ends.push(tokens);
  }
  const breakpoints = blocks.flatMap(({ block }, index) => (block.cache_control != null ? [index] : []));
  if (body.cache_control && blocks.length > 0) breakpoints.push(blocks.length - 1);
  let read = 0;
  for (const at of breakpoints) {
    for (let index = at; index >= Math.max(0, at - LOOKBACK_BLOCKS); index--) {
      if (cache.has(hashes[index]!)) {
        read = Math.max(read, ends[index]!);
        break;
      }
    }
  }
  let written = read;
  for (const at of breakpoints) {
    if (ends[at]! <= read || ends[at]! < MIN_CACHEABLE_TOKENS) continue;
    cache.set(hashes[at]!, ends[at]!);
    written = Math.max(written, ends[at]!);
  }
  return {
    usage: { input_tokens: tokens - written, cache_creation_input_tokens: written - read, cache_read_input_tokens: read, output_tokens: OUTPUT_TOKENS },
    breakpointTokens: breakpoints.map((at) => ends[at]!),
  };
}

function answerBlocks(scripted: Scripted[]): WireBlock[] {
  return scripted.map((s): WireBlock => ('text' in s ? { type: 'text', text: s.text } : { type: 'tool_use', id: `toolu_${++ids}`, name: s.call, input: s.input }));
}

/** The SSE events of an answer, as the API streams them: usage (cache counts included) in
 *  `message_start`, the output's in `message_delta`. */
function answerEvents(blocks: WireBlock[], stopReason: string, usage: CacheUsage): Array<[string, unknown]> {
  const events: Array<[string, unknown]> = [
    ['message_start', { type: 'message_start', message: { id: `msg_${++ids}`, type: 'message', role: 'assistant', model: 'claude-sonnet-4-5', content: [], stop_reason: null, stop_sequence: null, usage: { ...usage, output_tokens: 1 } } }],
  ];
  for (const [index, block] of blocks.entries()) {
    if (block.type === 'text') {
      events.push(['content_block_start', { type: 'content_block_start', index, content_block: { type: 'text', text: '' } }]);
      events.push(['content_block_delta', { type: 'content_block_delta', index, delta: { type: 'text_delta', text: block.text } }]);
    } else {
      const input = JSON.stringify(block.input);
      events.push(['content_block_start', { type: 'content_block_start', index, content_block: { ...block, input: {} } }]);
      events.push(['content_block_delta', { type: 'content_block_delta', index, delta: { type: 'input_json_delta', partial_json: input.slice(0, 4) } }]);
      events.push(['content_block_delta', { type: 'content_block_delta', index, delta: { type: 'input_json_delta', partial_json: input.slice(4) } }]);
    }
    events.push(['content_block_stop', { type: 'content_block_stop', index }]);
  }
  events.push(['message_delta', { type: 'message_delta', delta: { stop_reason: stopReason, stop_sequence: null }, usage: { output_tokens: usage.output_tokens } }], ['message_stop', { type: 'message_stop' }]);
  return events;
}

before(async () => {
  ({ server, origin: baseURL } = await startJsonServer<WireBody>((body, res, raw) => {
    const refused = refusal(body);
    if (refused) {
      received.push({ raw, body, breakpointTokens: [] });
      res.writeHead(400, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ type: 'error', error: { type: 'invalid_request_error', message: refused } }));
      return;
    }
    const { usage, breakpointTokens } = account(body);
    received.push({ raw, body, usage, breakpointTokens });
    const blocks = answerBlocks(script(body));
    const stopReason = blocks.some((b) => b.type === 'tool_use') ? 'tool_use' : 'end_turn';
    if (!body.stream) {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ id: `msg_${++ids}`, type: 'message', role: 'assistant', model: body.model, content: blocks, stop_reason: stopReason, stop_sequence: null, usage }));
      return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    for (const [event, data] of answerEvents(blocks, stopReason, usage)) res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
    res.end();
  }));
});
after(() => new Promise<void>((resolve) => server.close(() => resolve())));
beforeEach(() => {
  received.length = 0;
  cache.clear();
  script = () => [{ text: 'Hello.' }];
});

// ---------------------------------------------------------------------------------------------
// Helpers

/** Instructions long enough to cache on their own, as an agent's often are (about 1,500
 *  tokens with the tool definition before them). */
const INSTRUCTIONS = Array.from({ length: 60 }, (_, n) => `Rule ${n + 1}: look every record up with the lookup tool before you answer about it, and say which record you used.`).join('\n');

const lookupTool: ToolDefinition = {
  name: 'lookup',
  description: 'Looks a record up by its number',
  inputSchema: { type: 'object', properties: { record: { type: 'number' } }, required: ['record'] },
};

/** Three lookups, one a turn, then the answer. */
const threeLookups = (body: WireBody): Scripted[] => {
  const done = toolResultsSoFar(body);
  return done < 3 ? [{ call: 'lookup', input: { record: done + 1 } }] : [{ text: 'Records 1 to 3 are all fine.' }];
};

function model(options: Partial<AnthropicOptions> = {}): ModelProvider {
  return anthropic({ baseURL, apiKey: 'k', model: 'claude-sonnet-4-5', retry: { maxRetries: 0 }, ...options });
}

/** An agent with the lookup tool and the long instructions. */
async function lookupAgent(options: Partial<AnthropicOptions> = {}) {
  const lookup = tool({ ...lookupTool, execute: ({ record }: { record: number }) => ({ record, status: 'fine' }) });
  return createAgent({ model: model(options), tools: [lookup], instructions: INSTRUCTIONS, store: memoryStore() });
}

/** Runs `input`, with the usage of each step and of the run. */
async function run(agent: Awaited<ReturnType<typeof lookupAgent>>, input: string, sessionId?: string): Promise<{ text: string; steps: Array<{ inputTokens: number; outputTokens: number }>; usage: RunUsage }> {
  const steps: Array<{ inputTokens: number; outputTokens: number }> = [];
  let end: Extract<AgentEvent, { type: 'agent.end' }> | undefined;
  for await (const event of agent.stream(input, { sessionId })) {
    if (event.type === 'step.end') steps.push(event.usage);
    if (event.type === 'agent.error') throw new Error(`${event.error.code}: ${event.error.message}`);
    if (event.type === 'agent.end') end = event;
  }
  assert.ok(end, 'the run ended');
  return { text: end.text, steps, usage: end.usage };
}

/** Where a request put its breakpoints: paths such as `tools.0`, `system.0`,
 *  `messages.3.content.1`, and the `cache_control` of each. */
function breakpoints(body: WireBody): Array<[string, unknown]> {
  const found: Array<[string, unknown]> = blocksOf(body).flatMap(({ path, block }) => (block.cache_control != null ? [[path, block.cache_control] as [string, unknown]] : []));
  if (body.cache_control) found.unshift(['(automatic)', body.cache_control]);
  return found;
}

const paths = (body: WireBody) => breakpoints(body).map(([path]) => path);

async function drain(stream: AsyncIterable<ModelChunk>): Promise<string> {
  let text = '';
  for await (const chunk of stream) if (chunk.type === 'text') text += chunk.delta;
  return text;
}

/** A conversation in the middle of a tool loop: a question, a turn with `calls` parallel
 *  lookups, and their results. */
function afterTurn(calls: number, first = 1): ChatMessage[] {
  const toolCalls = Array.from({ length: calls }, (_, n) => ({ id: `toolu_r${first + n}`, name: 'lookup', arguments: JSON.stringify({ record: first + n }) }));
  return [
    { role: 'assistant', content: '', toolCalls },
    ...toolCalls.map((call): ChatMessage => ({ role: 'tool', toolCallId: call.id, name: 'lookup', content: JSON.stringify({ record: JSON.parse(call.arguments).record, status: 'fine' }) })),
  ];
}

function request(messages: ChatMessage[], extra: Partial<ModelRequest> = {}): ModelRequest {
  return { messages: [{ role: 'system', content: INSTRUCTIONS }, ...messages], tools: [lookupTool], ...extra };
}

// ---------------------------------------------------------------------------------------------
// Tests

describe('anthropic(): prompt caching', () => {
  it('an agent run over three tool turns reads each turn the prefix the turn before wrote, streamed and whole, and its usage counts cached tokens as input', async () => {
    for (const stream of [true, false]) {
      received.length = 0;
      cache.clear();
      script = threeLookups;
      const agent = await lookupAgent({ stream, promptCaching: true });
      const { text, steps, usage } = await run(agent, 'Are records 1 to 3 fine?');
      assert.equal(text, 'Records 1 to 3 are all fine.', `stream: ${stream}`);
      assert.equal(received.length, 4, 'three tool turns and the answer');
      const reported = received.map((r) => r.usage!);
      const totals = reported.map((u) => u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens);

      // Turn 1 writes tools, instructions and question; every later turn reads all the turn
      // before sent (its breakpoint at the end of the conversation) and writes only what is new.
      assert.equal(reported[0]!.cache_read_input_tokens, 0);
      assert.ok(reported[0]!.cache_creation_input_tokens >= MIN_CACHEABLE_TOKENS, JSON.stringify(reported[0]));
      for (let turn = 1; turn < 4; turn++) {
        assert.equal(reported[turn]!.cache_read_input_tokens, totals[turn - 1], `turn ${turn + 1} reads the whole of turn ${turn}'s request (stream: ${stream})`);
        assert.ok(reported[turn]!.cache_creation_input_tokens < totals[turn - 1]! / 4, `turn ${turn + 1} writes only what is new: ${JSON.stringify(reported[turn])}`);
      }

      // Input tokens include the cached ones, read or written, per step and for the run.
      assert.deepEqual(steps, totals.map((inputTokens) => ({ inputTokens, outputTokens: OUTPUT_TOKENS })));
      const sum = totals.reduce((a, b) => a + b, 0);
      assert.equal(usage.inputTokens, sum);
      assert.equal(usage.outputTokens, 4 * OUTPUT_TOKENS);
      assert.deepEqual(usage.byModel['anthropic:claude-sonnet-4-5'], { inputTokens: sum, outputTokens: 4 * OUTPUT_TOKENS });

      // A follow-up in the session (its history sent again) reads the run before up to its
      // answer; a run in another session reads the tools and instructions.
      received.length = 0;
      script = () => [{ text: 'Nothing to look up.' }];
      await run(agent, 'And record 4?');
      assert.equal(received[0]!.usage!.cache_read_input_tokens, totals[3], 'the follow-up reads the whole run before but its answer');
      await run(agent, 'Hello?', 'another');
      const [system] = received[1]!.breakpointTokens.filter((_, n) => paths(received[1]!.body)[n] === 'system.0');
      assert.ok(system! >= MIN_CACHEABLE_TOKENS);
      assert.equal(received[1]!.usage!.cache_read_input_tokens, system, 'a run in another session reads tools and instructions');
      await agent.close();
    }
  });

  it('without promptCaching (or with false) no cache_control is sent, the system prompt is a string, and nothing is read from the cache', async () => {
    for (const promptCaching of [undefined, false]) {
      received.length = 0;
      script = threeLookups;
      const agent = await lookupAgent({ promptCaching });
      await run(agent, 'Are records 1 to 3 fine?');
      assert.equal(received.length, 4);
      for (const { raw, body, usage } of received) {
        assert.doesNotMatch(raw, /cache_control/);
        assert.equal(typeof body.system, 'string');
        assert.equal(usage!.cache_read_input_tokens, 0);
      }
      await agent.close();
    }
  });

  it('breakpoints go on the last tool, the system prompt, the end of the conversation and where the previous turn ended: four, none on a thinking block', async () => {
    const thought = { thinking: [{ type: 'thinking', thinking: 'Record 1 first.', signature: 'sig' }] };
    const messages: ChatMessage[] = [
      { role: 'user', content: 'Are records 1 and 2 fine?' },
      { role: 'assistant', content: 'Looking.', toolCalls: [{ id: 'toolu_a', name: 'lookup', arguments: '{"record":1}', providerData: thought }] },
      { role: 'tool', toolCallId: 'toolu_a', name: 'lookup', content: '{"record":1,"status":"fine"}' },
      { role: 'assistant', content: '', toolCalls: [{ id: 'toolu_b', name: 'lookup', arguments: '{"record":2}', providerData: thought }] },
      { role: 'tool', toolCallId: 'toolu_b', name: 'lookup', content: '{"record":2,"status":"fine"}' },
    ];
    await drain(model({ promptCaching: true }).stream(request(messages, { tools: [{ ...lookupTool, name: 'other' }, lookupTool] })));
    const body = received.at(-1)!.body;
    assert.ok(received.at(-1)!.usage, 'accepted');
    // tools.1, then system, then the last tool_result, and the result the turn before ended with.
    assert.deepEqual(paths(body), ['tools.1', 'system.0', 'messages.2.content.0', 'messages.4.content.0']);
    assert.deepEqual(breakpoints(body).map(([, control]) => control), Array(4).fill({ type: 'ephemeral' }));
    assert.deepEqual((body.messages[3]!.content as WireBlock[]).map((b) => b.type), ['thinking', 'tool_use']);
    assert.deepEqual(body.system, [{ type: 'text', text: INSTRUCTIONS, cache_control: { type: 'ephemeral' } }]);

    // The first turn: its question (a string) becomes one text block to carry the breakpoint.
    await drain(model({ promptCaching: true }).stream(request([{ role: 'user', content: 'Are records 1 and 2 fine?' }])));
    const first = received.at(-1)!.body;
    assert.deepEqual(paths(first), ['tools.0', 'system.0', 'messages.0.content.0']);
    assert.deepEqual(first.messages[0]!.content, [{ type: 'text', text: 'Are records 1 and 2 fine?', cache_control: { type: 'ephemeral' } }]);
  });

  it('a turn of twelve parallel calls, more than the 20 blocks the API looks back, still reads the turn before: the breakpoint where it ended', async () => {
    const question: ChatMessage = { role: 'user', content: 'Are records 1 to 13 fine?' };
    const before = [question, ...afterTurn(1)];
    await drain(model({ promptCaching: true }).stream(request(before)));
    const previous = received.at(-1)!.usage!;
    // 24 blocks more: twelve tool_use and twelve tool_result.
    await drain(model({ promptCaching: true }).stream(request([...before, ...afterTurn(12, 2)])));
    const next = received.at(-1)!;
    assert.equal(next.usage!.cache_read_input_tokens, previous.input_tokens + previous.cache_creation_input_tokens + previous.cache_read_input_tokens);
    assert.deepEqual(paths(next.body), ['tools.0', 'system.0', 'messages.2.content.0', 'messages.4.content.11']);
  });

  it('a last message whose text is empty carries no breakpoint: the block before it does, as the docs say ("Empty text blocks cannot be cached")', async () => {
    const messages: ChatMessage[] = [{ role: 'user', content: 'Is record 1 fine?' }, ...afterTurn(1), { role: 'assistant', content: 'It is.' }, { role: 'user', content: ' ' }];
    await drain(model({ promptCaching: true, stream: false }).stream({ ...request(messages), messages: [{ role: 'system', content: '' }, ...messages] }));
    const { body, usage } = received.at(-1)!;
    assert.ok(usage, `accepted: ${received.at(-1)!.raw}`);
    assert.equal(body.system, '', 'an empty system prompt stays a string, with no breakpoint');
    assert.equal(body.messages.at(-1)!.content, ' ');
    // The answer before the blank message ends the conversation's cached prefix; the breakpoint
    // of the turn before falls on the tool result.
    assert.deepEqual(paths(body), ['tools.0', 'messages.2.content.0', 'messages.3.content.0']);
    assert.deepEqual(body.messages[3]!.content, [{ type: 'text', text: 'It is.', cache_control: { type: 'ephemeral' } }]);
  });

  it("ttl passes through to every breakpoint: '1h', '5m', or none", async () => {
    for (const [promptCaching, control] of [
      [{ ttl: '1h' }, { type: 'ephemeral', ttl: '1h' }],
      [{ ttl: '5m' }, { type: 'ephemeral', ttl: '5m' }],
      [{}, { type: 'ephemeral' }],
      [true, { type: 'ephemeral' }],
    ] as const) {
      await drain(model({ promptCaching }).stream(request([{ role: 'user', content: 'Is record 1 fine?' }, ...afterTurn(1)])));
      const { body, usage } = received.at(-1)!;
      assert.ok(usage, 'accepted');
      assert.deepEqual(breakpoints(body).map(([, c]) => c), Array(4).fill(control), JSON.stringify(promptCaching));
    }
  });

  it('extraBody still wins: its system replaces the breakpointed one, and its cache_control blocks count against the four', async () => {
    const messages: ChatMessage[] = [{ role: 'user', content: 'Is record 1 fine?' }, ...afterTurn(1)];
    await drain(model({ promptCaching: true, extraBody: { system: 'Answer briefly.' } }).stream(request(messages)));
    assert.equal(received.at(-1)!.body.system, 'Answer briefly.');
    assert.deepEqual(paths(received.at(-1)!.body), ['tools.0', 'messages.0.content.0', 'messages.2.content.0']);

    // Automatic caching asked for through extraBody takes a place: the previous turn's is left out.
    await drain(model({ promptCaching: true, extraBody: { cache_control: { type: 'ephemeral' } } }).stream(request(messages)));
    assert.ok(received.at(-1)!.usage, `accepted: ${received.at(-1)!.raw}`);
    assert.deepEqual(paths(received.at(-1)!.body), ['(automatic)', 'tools.0', 'system.0', 'messages.2.content.0']);

    // Four of its own: this provider adds none.
    const system = ['a', 'b', 'c', 'd'].map((text) => ({ type: 'text', text: `Part ${text}.`, cache_control: { type: 'ephemeral' } }));
    await drain(model({ promptCaching: true, extraBody: { system } }).stream(request(messages)));
    assert.ok(received.at(-1)!.usage, `accepted: ${received.at(-1)!.raw}`);
    assert.deepEqual(paths(received.at(-1)!.body), ['system.0', 'system.1', 'system.2', 'system.3']);
  });

  it('a forge judge on the provider: its requests (no tools, a system prompt) mark the system prompt only, and are accepted', async () => {
    script = (body) => (body.tools ? [{ text: 'Done.' }] : [{ text: JSON.stringify({ approved: true, safety: 0.95, correctness: 0.95, determinism: 0.95, boundedness: 0.9, confidence: 0.9, reasoning: 'ok' }) }]);
    const agent = await createAgent({
      model: model({ promptCaching: true }),
      store: memoryStore(),
      emergent: { enabled: true, judge: { model: model({ promptCaching: true, model: 'judge' }) }, promotionJudge: { model: model({ promptCaching: { ttl: '1h' }, model: 'panel' }) }, promotionThreshold: { uses: 1, confidence: 0.5 }, autoPromote: false },
    });
    const forged = await agent.forge(SLUGIFY_FORGE, { sessionId: 's1' });
    assert.equal(forged.success, true, JSON.stringify(forged));
    await agent.tools.call('slugify', { text: 'A b' }, { sessionId: 's1' });
    const promotion = await agent.emergent.requestPromotion('slugify', 'agent', { sessionId: 's1' });
    assert.equal(promotion.status, 'promoted', JSON.stringify(promotion));
    await agent.close();

    const judged = received.filter((r) => r.body.model === 'judge');
    const panel = received.filter((r) => r.body.model === 'panel');
    assert.equal(judged.length, 1);
    assert.ok(panel.length >= 1, 'the promotion panel asked');
    for (const { body, usage, raw } of [...judged, ...panel]) {
      assert.ok(usage, `accepted: ${raw}`);
      assert.equal(body.tools, undefined);
      const ttl = body.model === 'panel' ? { ttl: '1h' } : {};
      assert.deepEqual(breakpoints(body), [['system.0', { type: 'ephemeral', ...ttl }]], 'the reviewer instructions only: the review itself is asked once');
      assert.equal(typeof body.messages[0]!.content, 'string');
    }
  });

  it('promptCaching other than true, false or { ttl: "5m" | "1h" } is invalid_config', () => {
    const table: Array<[unknown, RegExp]> = [
      ['yes', /`promptCaching` must be true, false or \{ ttl: '5m' \| '1h' \} \(got/],
      [1, /`promptCaching` must be true, false/],
      [[], /`promptCaching` must be true, false/],
      [{ ttl: '10m' }, /`promptCaching.ttl` must be one of '5m', '1h' \(got/],
      [{ ttl: 3600 }, /`promptCaching.ttl` must be one of '5m', '1h'/],
      [{ ttl: '1h', breakpoints: 2 }, /`promptCaching.breakpoints` must be left out: promptCaching takes `ttl` only/],
      [{ type: 'ephemeral' }, /`promptCaching.type` must be left out/],
    ];
    for (const [promptCaching, message] of table) {
      assert.throws(
        () => anthropic({ model: 'claude-sonnet-4-5', promptCaching } as unknown as AnthropicOptions),
        (error: unknown) => error instanceof CrucibleError && error.code === 'invalid_config' && message.test(error.message),
        JSON.stringify(promptCaching),
      );
    }
    for (const promptCaching of [true, false, null, undefined, {}, { ttl: '5m' }, { ttl: '1h' }, { ttl: null }]) {
      anthropic({ model: 'claude-sonnet-4-5', promptCaching } as unknown as AnthropicOptions);
    }
  });
});

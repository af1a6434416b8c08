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
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, beforeEach, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { CrucibleError } from '../src/errors.js';
import { anthropic } from '../src/node.js';
import type { AnthropicOptions, ModelChunk, ModelProvider } from '../src/providers/types.js';

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
  thinking?: { type: string; budget_tokens?: number };
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
/** The thinking, redacted-thinking and tool_use blocks of every answer given, by its first call's id. */
const issued = new Map<string, WireBlock[]>();
let ids = 0;

/** Why the real API would refuse `body`, in its words, or `undefined`. */
function refusal(body: WireBody): string | undefined {
  const thinking = body.thinking?.type === 'enabled';
  if (thinking) {
    const budget = body.thinking!.budget_tokens ?? 0;
    if (budget < 1024) return 'thinking.enabled.budget_tokens: Input should be greater than or equal to 1024';
    if (body.max_tokens <= budget) return '`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking#max-tokens-and-context-window-size';
    if (body.temperature !== undefined && body.temperature !== 1) return '`temperature` may only be set to 1 when thinking is enabled. Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking#feature-compatibility';
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
  server = createServer(async (req, res) => {
    let text = '';
    for await (const piece of req) text += piece;
    const body = JSON.parse(text) as WireBody;
    bodies.push(body);
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
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  baseURL = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
after(() => new Promise<void>((resolve) => server.close(() => resolve())));
beforeEach(() => {
  bodies.length = 0;
  eventDelayMs = 0;
});

// ---------------------------------------------------------------------------------------------
// Helpers

function model(options: Partial<AnthropicOptions> = {}): ModelProvider {
  return anthropic({ baseURL, apiKey: 'k', model: 'claude-sonnet-4-5', thinking: { budgetTokens: 2048 }, retry: { maxRetries: 0 }, ...options });
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

  it('is checked when the provider is created: anything but a whole budget of at least 1024 tokens is invalid_config', () => {
    for (const thinking of [true, 'high', 4096, {}, { budgetTokens: 1023 }, { budgetTokens: 2048.5 }, { budgetTokens: '2048' }, { budget_tokens: 2048 }, { budgetTokens: Number.POSITIVE_INFINITY }]) {
      assert.throws(
        () => anthropic({ model: 'claude-sonnet-4-5', thinking } as unknown as AnthropicOptions),
        (error: unknown) => error instanceof CrucibleError && error.code === 'invalid_config' && /anthropic\(\): `thinking(\.budgetTokens)?` must be a whole number of tokens, at least 1024/.test(error.message),
        JSON.stringify(thinking),
      );
    }
    assert.doesNotThrow(() => anthropic({ model: 'm', thinking: { budgetTokens: 1024 } }));
    assert.doesNotThrow(() => anthropic({ model: 'm', thinking: null } as unknown as AnthropicOptions));
  });
});

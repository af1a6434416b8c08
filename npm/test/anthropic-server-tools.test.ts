/**
 * anthropic() with server tools (web search, the MCP connector), against a local server that
 * streams the Messages API's events byte for byte as the real one does (TEST DOUBLE: scripted
 * answers, real HTTP and SSE). The API runs these tools itself, within the answer: it streams a
 * `server_tool_use` (or `mcp_tool_use`) block whose input comes in `input_json_delta`s, as a
 * client call's does, then the result block, then the text written from it.
 *
 * The wire format: https://docs.anthropic.com/en/docs/build-with-claude/streaming ("Web search
 * tool use"), https://docs.anthropic.com/en/docs/agents-and-tools/tool-use/web-search-tool and
 * https://docs.anthropic.com/en/docs/agents-and-tools/mcp-connector.
 */

import assert from 'node:assert/strict';
import type { Server } from 'node:http';
import { after, before, beforeEach, describe, it } from 'node:test';
import { CrucibleError } from '../src/errors.js';
import { anthropic, createAgent, tool } from '../src/node.js';
import type { AnthropicOptions, ModelChunk } from '../src/providers/types.js';
import { startJsonServer } from './support/json-server.js';

// ---------------------------------------------------------------------------------------------
// The server

interface WireBlock {
  type: string;
  [field: string]: unknown;
}
interface WireBody {
  messages: Array<{ role: 'user' | 'assistant'; content: string | WireBlock[] }>;
  tools?: Array<Record<string, unknown>>;
  stream?: boolean;
}

/** An answer: the SSE events to stream, or the message to send whole. */
type Answer = { events: string[] } | { message: Record<string, unknown> };

let server: Server;
let baseURL = '';
const bodies: WireBody[] = [];
/** The answers to give, one a request, in order. */
let answers: Answer[] = [];

before(async () => {
  ({ server, origin: baseURL } = await startJsonServer<WireBody>((body, res) => {
    bodies.push(body);
    const answer = answers.shift();
    if (!answer) {
      res.writeHead(500, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ type: 'error', error: { type: 'api_error', message: 'test double: no answer left' } }));
    } else if ('message' in answer) {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(answer.message));
    } else {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(answer.events.join(''));
    }
  }));
});
after(() => new Promise<void>((resolve) => server.close(() => resolve())));
beforeEach(() => {
  bodies.length = 0;
  answers = [];
});

/** One SSE event as the API writes it: its type both as the event name and in the data. */
const ev = (type: string, data: Record<string, unknown> = {}) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
const messageStart = ev('message_start', { message: { id: 'msg_1', type: 'message', role: 'assistant', model: 'claude-sonnet-4-5', content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 2679, output_tokens: 3 } } });
const start = (index: number, content_block: Record<string, unknown>) => ev('content_block_start', { index, content_block });
const delta = (index: number, d: Record<string, unknown>) => ev('content_block_delta', { index, delta: d });
const stop = (index: number) => ev('content_block_stop', { index });
const end = (stopReason: string, usage: Record<string, unknown> = { output_tokens: 510 }) => [
  ev('message_delta', { delta: { stop_reason: stopReason, stop_sequence: null }, usage }),
  ev('message_stop'),
];
const textBlock = (index: number, text: string) => [start(index, { type: 'text', text: '' }), delta(index, { type: 'text_delta', text }), stop(index)];

const SEARCH_ID = 'srvtoolu_014hJH82Qum7Td6UV8gDXThB';
const PREAMBLE = "I'll check the weather in New York City for you.";
const ANSWER = 'It is 21°C and sunny.';

/** The API's own example of a streamed web search: text, the search (its query streamed as
 *  input), its results, then the text written from them. */
const webSearchEvents = [
  messageStart,
  ...textBlock(0, PREAMBLE),
  start(1, { type: 'server_tool_use', id: SEARCH_ID, name: 'web_search', input: {} }),
  delta(1, { type: 'input_json_delta', partial_json: '' }),
  delta(1, { type: 'input_json_delta', partial_json: '{"query":"weather NYC today"}' }),
  stop(1),
  start(2, { type: 'web_search_tool_result', tool_use_id: SEARCH_ID, content: [{ type: 'web_search_result', title: 'Weather', url: 'https://weather.com/', encrypted_content: 'Ev0DCioIAxgC', page_age: null }] }),
  stop(2),
  ...textBlock(3, ANSWER),
  ...end('end_turn', { output_tokens: 510, server_tool_use: { web_search_requests: 1 } }),
];

/** The same answer, whole, as the API sends it without `stream`. */
const webSearchMessage = {
  id: 'msg_1',
  type: 'message',
  role: 'assistant',
  model: 'claude-sonnet-4-5',
  stop_reason: 'end_turn',
  usage: { input_tokens: 2679, output_tokens: 510 },
  content: [
    { type: 'text', text: PREAMBLE },
    { type: 'server_tool_use', id: SEARCH_ID, name: 'web_search', input: { query: 'weather NYC today' } },
    { type: 'web_search_tool_result', tool_use_id: SEARCH_ID, content: [] },
    { type: 'text', text: ANSWER },
  ],
};

// ---------------------------------------------------------------------------------------------
// Helpers

const webSearch = { type: 'web_search_20250305', name: 'web_search', max_uses: 3 };
const clockTool = { name: 'clock', description: 'The time in a time zone', inputSchema: { type: 'object', properties: { zone: { type: 'string' } } } };

function model(options: Partial<AnthropicOptions> = {}) {
  return anthropic({ baseURL, apiKey: 'k', model: 'claude-sonnet-4-5', retry: { maxRetries: 0 }, ...options });
}

/** An agent with a clock tool of its own and the API's web search, as `extraBody` gives it;
 *  the zones the clock was asked for. */
async function agentWithWebSearch(options: Partial<AnthropicOptions> = {}) {
  const zones: string[] = [];
  const clock = tool({ ...clockTool, execute: ({ zone }: { zone: string }) => (zones.push(zone), '12:00') });
  const { inputSchema, ...wire } = clockTool;
  const extraBody = { tools: [{ ...wire, input_schema: inputSchema }, webSearch] };
  const agent = await createAgent({ model: model({ extraBody, ...options }), tools: [clock] });
  return { agent, zones };
}

async function chunksOf(stream: AsyncIterable<ModelChunk>): Promise<ModelChunk[]> {
  const chunks: ModelChunk[] = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

// ---------------------------------------------------------------------------------------------
// Tests

describe('anthropic(): server tools', () => {
  it('a web search, streamed as the API does: the text written from its results arrives and the run completes', async () => {
    answers = [{ events: webSearchEvents }];
    const { agent, zones } = await agentWithWebSearch();
    const run = await agent.run('Weather in NYC?');
    assert.equal(run.status, 'completed');
    assert.ok(run.status === 'completed' && run.text.startsWith(PREAMBLE) && run.text.endsWith(ANSWER), `got ${JSON.stringify(run.status === 'completed' && run.text)}`);
    assert.equal(run.finishReason, 'stop');
    assert.deepEqual(zones, [], "the search is the API's own: no tool of the agent runs");
    assert.equal(bodies.length, 1);
    assert.ok(bodies[0]!.stream);
  });

  it('the same answer whole (no `stream`) reads the same', async () => {
    answers = [{ message: webSearchMessage }];
    const { agent } = await agentWithWebSearch({ stream: false });
    const run = await agent.run('Weather in NYC?');
    assert.ok(run.status === 'completed' && run.text.startsWith(PREAMBLE) && run.text.endsWith(ANSWER), `got ${JSON.stringify(run.status === 'completed' && run.text)}`);
  });

  it('the MCP connector: an mcp_tool_use block with streamed input and its mcp_tool_result are read past', async () => {
    answers = [
      {
        events: [
          messageStart,
          ...textBlock(0, 'Let me ask the server. '),
          start(1, { type: 'mcp_tool_use', id: 'mcptoolu_01', name: 'echo', server_name: 'example-mcp', input: {} }),
          delta(1, { type: 'input_json_delta', partial_json: '{"message":' }),
          delta(1, { type: 'input_json_delta', partial_json: '"Hello"}' }),
          stop(1),
          start(2, { type: 'mcp_tool_result', tool_use_id: 'mcptoolu_01', is_error: false, content: [{ type: 'text', text: 'Hello' }] }),
          stop(2),
          ...textBlock(3, 'It said Hello.'),
          ...end('end_turn'),
        ],
      },
    ];
    const chunks = await chunksOf(model().stream({ messages: [{ role: 'user', content: 'Echo Hello' }], tools: [] }));
    assert.deepEqual(chunks, [
      { type: 'text', delta: 'Let me ask the server. ' },
      { type: 'text', delta: 'It said Hello.' },
      { type: 'finish', finishReason: 'end_turn', usage: { inputTokens: 2679, outputTokens: 510 } },
    ]);
  });

  it("a search and a call of the agent's in one answer: the call keeps number 0 and its own input, runs, and goes back with the turn", async () => {
    answers = [
      {
        events: [
          messageStart,
          ...textBlock(0, PREAMBLE),
          start(1, { type: 'server_tool_use', id: SEARCH_ID, name: 'web_search', input: {} }),
          delta(1, { type: 'input_json_delta', partial_json: '{"query":"weather NYC today"}' }),
          stop(1),
          start(2, { type: 'web_search_tool_result', tool_use_id: SEARCH_ID, content: [] }),
          stop(2),
          start(3, { type: 'tool_use', id: 'toolu_clock', name: 'clock', input: {} }),
          delta(3, { type: 'input_json_delta', partial_json: '{"zone":' }),
          delta(3, { type: 'input_json_delta', partial_json: '"America/New_York"}' }),
          stop(3),
          ...end('tool_use'),
        ],
      },
      { events: [messageStart, ...textBlock(0, `${ANSWER} It is noon.`), ...end('end_turn')] },
    ];
    const { agent, zones } = await agentWithWebSearch();
    const run = await agent.run('Weather and time in NYC?');
    assert.ok(run.status === 'completed' && run.text === `${ANSWER} It is noon.`, `got ${JSON.stringify(run.status === 'completed' && run.text)}`);
    assert.deepEqual(zones, ['America/New_York']);
    // The turn goes back as its text and the agent's call; the search is not kept.
    assert.deepEqual(bodies[1]!.messages.slice(1), [
      {
        role: 'assistant',
        content: [
          { type: 'text', text: PREAMBLE },
          { type: 'tool_use', id: 'toolu_clock', name: 'clock', input: { zone: 'America/New_York' } },
        ],
      },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_clock', content: JSON.stringify('12:00') }] },
    ]);
  });

  it('an input_json_delta for a block that never started is still a protocol error', async () => {
    answers = [{ events: [messageStart, ...textBlock(0, 'Hi'), delta(5, { type: 'input_json_delta', partial_json: '{"query":"x"}' }), ...end('end_turn')] }];
    await assert.rejects(chunksOf(model().stream({ messages: [{ role: 'user', content: 'Hi' }], tools: [] })), (error) => {
      assert.ok(error instanceof CrucibleError, String(error));
      assert.equal(error.code, 'provider_protocol');
      assert.match(error.message, /input_json_delta for unknown block 5/);
      return true;
    });
  });
});

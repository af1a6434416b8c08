// The core's memory never shrinks: what a tool returns or a model asks, past the bounds that
// refuse it anyway, must be refused before it is parsed into many times its size. In a file of
// its own, so the core starts small and its growth shows.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createAgent, openai, tool } from '../src/node.js';
import { coreMemoryBytes } from './support/core-internals.js';
import { allEvents as collect } from './support/events.js';
import { SLUGIFY_FORGE } from './support/forge-fixtures.js';
import { startMockLlmServer, type MockLlmServer } from './support/mock-llm-server.js';

let server: MockLlmServer;
before(async () => {
  server = await startMockLlmServer({ replies: [] });
});
after(() => server.close());

const model = () => openai({ baseURL: server.openaiBaseURL, apiKey: 'none', model: 'qwen', retry: { maxRetries: 0 } });

describe("what enters the core's memory", () => {
  test('a host tool result far past maxResultBytes is refused unparsed: the core does not grow by many times its size for good', async () => {
    server.reset();
    server.enqueue({ toolCalls: [{ name: 'rows', arguments: {} }] }, { text: 'Done.' });
    // 8 MB of small objects: parsed, they took ~15 times that in the core's memory, which never
    // shrinks, before the default 64 KiB bound refused them.
    const rows = tool({ name: 'rows', description: 'r', inputSchema: { type: 'object', properties: {} }, execute: () => Array.from({ length: 800_000 }, (_, k) => ({ k })) });
    const agent = await createAgent({ model: model(), tools: [rows] });
    const before = coreMemoryBytes();
    const events = await collect(agent.stream('?'));
    const grown = coreMemoryBytes() - before;
    const error = events.find((e) => e.type === 'tool.execute.error');
    assert.ok(error?.type === 'tool.execute.error' && error.error.code === 'result_too_large', JSON.stringify(error).slice(0, 300));
    assert.match(error.error.message, /^`rows` returned \d+ bytes of JSON text; the limit is 65536 bytes$/);
    assert.ok(grown < 32 * 2 ** 20, `the core's memory grew by ${(grown / 2 ** 20).toFixed(0)} MiB for good`);
    assert.equal(events.at(-1)!.type, 'agent.end');
    await agent.close();
  });

  test('a result whose JS text is longer than its JSON (1e20 written in 21 digits) is measured as JSON: under maxResultBytes it passes', async () => {
    server.reset();
    server.enqueue({ toolCalls: [{ name: 'balances', arguments: {} }] }, { text: 'Done.' });
    // 22,001 bytes as JS writes them, 6,001 as the JSON the limit counts.
    const balances = tool({ name: 'balances', description: 'b', inputSchema: { type: 'object', properties: {} }, execute: () => Array.from({ length: 1000 }, () => 1e20) });
    const agent = await createAgent({ model: model(), tools: [balances], maxResultBytes: 10_000 });
    const events = await collect(agent.stream('?'));
    const end = events.find((e) => e.type === 'tool.execute.end');
    assert.ok(end?.type === 'tool.execute.end' && Array.isArray(end.result) && end.result.length === 1000, JSON.stringify(events.find((e) => e.type === 'tool.execute.error')));
    await agent.close();
  });

  test('a forge request far past its bound is a shape_check rejection read no further, from agent.forge and from the model', async () => {
    const huge = { ...SLUGIFY_FORGE, name: 'big', testCases: [{ input: { text: 'a', rows: Array.from({ length: 300_000 }, (_, k) => ({ k })) } }, { input: { text: 'b' } }] };
    const agent = await createAgent({ model: model(), emergent: { enabled: true } });
    const before = coreMemoryBytes();
    const direct = await agent.forge(huge, { sessionId: 's1' });
    assert.deepEqual([direct.success, !direct.success && direct.category], [false, 'shape_check']);
    assert.match(!direct.success ? direct.reason : '', /characters of JSON text; at most 2097152 are read/);
    server.reset();
    server.enqueue({ toolCalls: [{ name: 'forge_tool', arguments: huge }] }, { text: 'Gave up.' });
    const events = await collect(agent.stream('?', { sessionId: 's1' }));
    const rejected = events.find((e) => e.type === 'forge.rejected');
    assert.ok(rejected?.type === 'forge.rejected' && rejected.category === 'shape_check' && /at most 2097152 are read/.test(rejected.reason), JSON.stringify(rejected));
    const grown = coreMemoryBytes() - before;
    assert.ok(grown < 48 * 2 ** 20, `the core's memory grew by ${(grown / 2 ** 20).toFixed(0)} MiB for good`);
    assert.deepEqual([agent.emergent.stats().attempts, agent.emergent.stats().rejectionsByCategory.shape_check], [2, 2]);
    await agent.close();
  });
});

// End-to-end tier: the real local model (Qwen2.5-Coder-0.5B in llama-server, started by
// scripts/model/start.sh; scripts/test.sh exports CRUCIBLE_E2E_BASE_URL). Asserts structure,
// not wording: a 0.5B model's prose varies, its tool-calling shape must not.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createAgent, openai, tool, type AgentEvent } from '../src/node.js';

const baseURL = process.env.CRUCIBLE_E2E_BASE_URL;
const skip = baseURL ? false : 'set CRUCIBLE_E2E_BASE_URL (scripts/test.sh starts the local model and sets it)';

test('the real local model calls a host tool through the agent loop and answers', { skip, timeout: 240_000 }, async () => {
  const cities: string[] = [];
  const weather = tool({
    name: 'get_weather',
    description: 'Current weather for a city',
    inputSchema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    execute: async ({ city }: { city: string }) => {
      cities.push(city);
      return { city, celsius: 7, conditions: 'light rain' };
    },
  });
  const agent = await createAgent({
    model: openai({ baseURL: baseURL!, apiKey: 'none', model: 'qwen', timeoutMs: 120_000 }),
    instructions: 'You are concise. Use tools when they help.',
    tools: [weather],
    temperature: 0,
    maxTurns: 4,
  });
  const events: AgentEvent[] = [];
  for await (const event of agent.stream('What is the weather in Oslo?', { signal: AbortSignal.timeout(200_000) })) {
    events.push(event);
  }
  const call = events.find((e) => e.type === 'tool.call');
  assert.ok(call && call.type === 'tool.call', `expected a tool call, got ${events.map((e) => e.type).join(',')}`);
  assert.equal(call.name, 'get_weather');
  assert.match(JSON.stringify(call.arguments), /oslo/i);
  assert.ok(events.some((e) => e.type === 'tool.execute.end'), 'the tool ran');
  assert.deepEqual(cities.map((c) => c.toLowerCase()), ['oslo']);
  const end = events.at(-1)!;
  assert.equal(end.type, 'agent.end', JSON.stringify(end));
  if (end.type === 'agent.end') {
    assert.ok(end.text.trim().length > 0, 'a non-empty final answer');
    assert.ok(end.usage.inputTokens > 0 && end.usage.outputTokens > 0, 'usage is reported');
    assert.equal(end.steps, 1);
  }
  assert.ok(events.filter((e) => e.type === 'text.delta').length > 1, 'the answer streamed in pieces');
});

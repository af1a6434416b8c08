// End-to-end tier: the real local model (Qwen2.5-Coder-0.5B in llama-server, started by
// scripts/model/start.sh; scripts/test.sh exports CRUCIBLE_E2E_BASE_URL). Asserts structure,
// not wording: a 0.5B model's prose varies, its tool-calling shape must not.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createAgent, openai, tool, type AgentEvent } from '../src/node.js';
import { SLUGIFY_FORGE } from './support/forge-fixtures.js';

const baseURL = process.env.CRUCIBLE_E2E_BASE_URL;
const skip = baseURL ? false : 'set CRUCIBLE_E2E_BASE_URL (scripts/test.sh starts the local model and sets it)';

// Under CI the tier must run: a missing model is a failure there, not a quiet skip (unless the
// tier was skipped on purpose with CRUCIBLE_SKIP_E2E=1).
if (!baseURL && process.env.CI === 'true' && process.env.CRUCIBLE_SKIP_E2E !== '1') {
  test('the end-to-end tier has its local model (CI)', () => {
    assert.fail('CRUCIBLE_E2E_BASE_URL is not set: scripts/model/start.sh did not run or failed');
  });
}

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

test('the real local model judges a correct forged tool with a coherent verdict, and its panel promotes it after use', { skip, timeout: 300_000 }, async () => {
  const local = openai({ baseURL: baseURL!, apiKey: 'none', model: 'qwen', timeoutMs: 120_000 });
  const agent = await createAgent({ model: local, emergent: { enabled: true, judge: { model: local }, promotionThreshold: { uses: 2, confidence: 0.8 } } });
  const promoted = new Promise<AgentEvent>((resolve) => agent.on((e) => e.type === 'tool.promoted' && resolve(e)));
  try {
    const res = await agent.forge(SLUGIFY_FORGE, { sessionId: 'e2e' });
    assert.ok(res.success, `forge rejected: ${JSON.stringify(res)}`);
    // Scores are what promotion reads (confidence against promotionThreshold); a judge that
    // approves with every score 0 — what the "0..1" template got from this model — never
    // lets a tool be promoted, and is now refused as contradicting itself.
    const { verdict } = res;
    for (const score of [verdict.safety, verdict.correctness, verdict.determinism, verdict.boundedness, verdict.confidence]) {
      assert.ok(score >= 0.5 && score <= 1, `score ${score} in ${JSON.stringify(verdict)}`);
    }
    assert.ok(verdict.reasoning.length > 0 && verdict.reasoning.length <= 400, 'reasoning present and within the schema bound');
    // Promotion to the agent tier needs that confidence, then the two-reviewer panel (the same
    // model as safety and correctness reviewers) to approve.
    for (const text of ['Hello World', 'Rust and Wasm']) {
      assert.deepEqual(await agent.tools.call('slugify', { text }, { sessionId: 'e2e' }), { slug: text.toLowerCase().replaceAll(' ', '-') });
    }
    let timer: ReturnType<typeof setTimeout> | undefined;
    const deadline = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error('no promotion within 120 s')), 120_000)));
    // A pending timer would keep this file's process alive for its full 120 s.
    const event = await Promise.race([promoted, deadline]).finally(() => clearTimeout(timer));
    assert.ok(event.type === 'tool.promoted' && event.toTier === 'agent', JSON.stringify(event));
    assert.equal(agent.tools.list({ sessionId: 'e2e' }).find((t) => t.name === 'slugify')?.tier, 'agent');
  } finally {
    await agent.close();
  }
});

test('the real local model forges a tool by itself through forge_tool, then calls it and answers with its result', { skip, timeout: 300_000 }, async () => {
  // As the demo's step 4 runs it: constrained calls, bounded answers, a task this model writes
  // correct code for (bench/real-model-forge.ts: 3 of 10 tasks answered right through a tool).
  const weather = tool({
    name: 'get_weather',
    description: 'Current temperature in Celsius for a city',
    inputSchema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    execute: async ({ city }: { city: string }) => ({ city, celsius: 21 }),
  });
  const local = openai({ baseURL: baseURL!, apiKey: 'none', model: 'qwen', timeoutMs: 180_000 });
  const agent = await createAgent({
    model: local,
    instructions: 'You are concise. Use a tool when one fits. If no tool fits, create one with forge_tool, then call it, then answer with its result.',
    tools: [weather],
    temperature: 0,
    maxTurns: 6,
    toolChoice: 'required',
    maxTokens: 768,
    emergent: { enabled: true, judge: { model: local } },
  });
  try {
    const events: AgentEvent[] = [];
    const question = 'No tool fits: create one with forge_tool, then call it. Sum the numbers 4, 8, 15, 16, 23 and 42.';
    for await (const event of agent.stream(question, { sessionId: 'forging', signal: AbortSignal.timeout(280_000) })) events.push(event);
    const registered = events.find((e) => e.type === 'forge.registered');
    assert.ok(registered?.type === 'forge.registered', `no tool registered: ${events.filter((e) => e.type.startsWith('forge.')).map((e) => JSON.stringify(e).slice(0, 300)).join('\n')}`);
    const tests = events.filter((e) => e.type === 'forge.test');
    assert.ok(tests.length >= 2 && tests.every((e) => e.type === 'forge.test' && e.test.passed), 'its tests ran and passed');
    const ran = events.find((e) => e.type === 'tool.execute.end' && e.name === registered.name);
    assert.ok(ran?.type === 'tool.execute.end', `the model did not call ${registered.name} in the run`);
    assert.match(JSON.stringify(ran.result), /\b108\b/);
    const end = events.at(-1)!;
    assert.ok(end.type === 'agent.end', JSON.stringify(end).slice(0, 500));
    assert.match(end.text, /\b108\b/);
    assert.equal(agent.emergent.stats().approved, 1);
  } finally {
    await agent.close();
  }
});

test("the local model's chat template asks for the new tool's call after a forge and for the answer otherwise", { skip }, async () => {
  // llama-server renders a request through the chat template without generating (fast and
  // deterministic). The forge_tool results carry the markers tests/forge_agent_run.rs pins.
  const forgeTool = { type: 'function', function: { name: 'forge_tool', description: 'Create a tool', parameters: { type: 'object', properties: { name: { type: 'string' } } } } };
  const countVowels = { type: 'function', function: { name: 'count_vowels', description: 'Count vowels', parameters: { type: 'object', properties: { text: { type: 'string' } } } } };
  const render = async (toolName: string, result: string, tools: object[] = [forgeTool]): Promise<string> => {
    const res = await fetch(`${baseURL!.replace(/\/v1\/?$/, '')}/apply-template`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        messages: [
          { role: 'user', content: 'Count the vowels in "banana".' },
          { role: 'assistant', content: '', tool_calls: [{ id: 'c1', type: 'function', function: { name: toolName, arguments: '{}' } }] },
          { role: 'tool', tool_call_id: 'c1', content: result },
        ],
        tools,
      }),
    });
    assert.equal(res.status, 200);
    return ((await res.json()) as { prompt: string }).prompt;
  };
  const rejected = await render('forge_tool', JSON.stringify({ success: false, reason: '1 of 2 tests failed', category: 'other', hint: 'Fix the request according to the reason and call forge_tool again.' }));
  // A rejected forge is answered in text (retries by this model did not parse or repeated
  // the rejected request; scripts/model/README.md).
  assert.doesNotMatch(rejected, /# Tools/);
  assert.match(rejected, /answer my previous question in plain text/);
  const ready = await render('forge_tool', JSON.stringify({ success: true, name: 'count_vowels', tier: 'session', version: 1, message: 'Tool `count_vowels` is ready. Call it by name in your next step.' }));
  assert.match(ready, /# Tools/);
  assert.match(ready, /Now call the new tool with the values from my previous question\.<\|im_end\|>\n<\|im_start\|>assistant\n$/);
  // Offered the new tool (as the runtime does in the next turn), the model is not shown the
  // forge call it would repeat (this model copies its last turn), nor forge_tool: it is asked
  // for the new tool's call. A forge answered "already exists" reads the same.
  for (const message of ['Tool `count_vowels` is ready. Call it by name in your next step.', 'Tool `count_vowels` already exists exactly as requested, so nothing was forged again. Call it by name in your next step.']) {
    const made = await render('forge_tool', JSON.stringify({ success: true, name: 'count_vowels', tier: 'session', version: 1, message }), [forgeTool, countVowels]);
    assert.doesNotMatch(made, /forge_tool/);
    assert.match(made, /"count_vowels"/);
    assert.match(made, /<\|im_start\|>user\nCount the vowels in "banana"\.<\|im_end\|>\n<\|im_start\|>user\nThe tool count_vowels now exists\. Call it with the values from my question:\n\{"name": "count_vowels", "arguments": \{"text": <string>\}\}<\|im_end\|>\n<\|im_start\|>assistant\n$/);
  }
  const host = await render('get_weather', JSON.stringify({ city: 'Oslo', celsius: 7 }));
  assert.doesNotMatch(host, /# Tools/);
  assert.match(host, /answer my previous question in plain text/);
});

test('the real local model answers a `returns` schema on the first try (decoding constrained to it)', { skip, timeout: 240_000 }, async () => {
  const agent = await createAgent({
    model: openai({ baseURL: baseURL!, apiKey: 'none', model: 'qwen', timeoutMs: 120_000 }),
    temperature: 0,
    returns: { type: 'object', properties: { city: { type: 'string' }, celsius: { type: 'number' }, raining: { type: 'boolean' } }, required: ['city', 'celsius', 'raining'] },
  });
  try {
    // Without the schema as the response format, the first two ended in
    // structured_output_invalid after 3 attempts (its answers lacked the required keys).
    const cases = [
      { text: 'It is 7 degrees and raining in Oslo today.', want: { city: 'Oslo', celsius: 7, raining: true } },
      { text: 'Lima: sunny, 24 °C.', want: { city: 'Lima', celsius: 24, raining: false } },
    ];
    for (const { text, want } of cases) {
      const events: AgentEvent[] = [];
      for await (const event of agent.stream(`Extract the weather facts: ${text}`)) events.push(event);
      const end = events.at(-1)!;
      assert.equal(end.type, 'agent.end', JSON.stringify(end));
      assert.equal(events.filter((e) => e.type === 'output.retry').length, 0, 'no re-prompt');
      if (end.type === 'agent.end') assert.deepEqual(end.output, want);
    }
  } finally {
    await agent.close();
  }
});

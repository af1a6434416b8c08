// A tiny app as a user would write it: an agent with one host tool, its streamed answer
// rendered into the page; then a second agent with emergent capabilities forges a `slugify`
// sandbox tool (tested in the package's sandbox Web Worker, reviewed by a test-double judge)
// and calls it. The packaging test serves it bundled by Vite and as a plain ES module behind
// an import map. The model endpoint comes from `?llm=<openai base URL>`, the forge request
// (the tests' `SLUGIFY_FORGE`) from `?forge=<JSON>`.
import { createAgent, openai, tool } from 'crucible-agents';

const status = document.getElementById('status');
const answer = document.getElementById('answer');
const events = document.getElementById('events');
const forged = document.getElementById('forged');
const finish = (state, text) => {
  status.dataset.state = state;
  status.textContent = text;
};

/** Test double of the judge: a ModelProvider that approves every forge, without a network. */
const approvingJudge = {
  id: 'test-double:judge',
  async *stream() {
    const verdict = { approved: true, safety: 0.95, correctness: 0.95, determinism: 0.95, boundedness: 0.9, confidence: 0.9, reasoning: 'ok' };
    yield { type: 'text', delta: JSON.stringify(verdict) };
    yield { type: 'finish', finishReason: 'stop' };
  },
};

try {
  const weather = tool({
    name: 'get_weather',
    description: 'Current temperature for a city',
    inputSchema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    execute: async ({ city }) => {
      document.body.dataset.toolCity = city;
      return { city, celsius: 21 };
    },
  });
  const params = new URLSearchParams(location.search);
  const baseURL = params.get('llm');
  const slugifyRequest = JSON.parse(params.get('forge') ?? 'null');
  const model = openai({ baseURL, apiKey: 'none', model: 'qwen', retry: { maxRetries: 0 } });
  const agent = await createAgent({
    model,
    instructions: 'You are concise.',
    tools: [weather],
  });
  for await (const ev of agent.stream('What is the weather in Oslo?')) {
    const item = document.createElement('li');
    item.textContent = ev.type;
    events.append(item);
    if (ev.type === 'text.delta') answer.textContent += ev.delta;
    if (ev.type === 'agent.error') throw new Error(`${ev.error.code}: ${ev.error.message}`);
  }

  const forger = await createAgent({ model, emergent: { enabled: true, judge: { model: approvingJudge } } });
  try {
    const result = await forger.forge(slugifyRequest);
    const summary = result.success
      ? { success: true, tier: result.tool.tier, version: result.tool.version, tests: result.tests.map((t) => t.passed) }
      : { success: false, category: result.category, reason: result.reason };
    if (result.success) summary.output = await forger.tools.call('slugify', { text: 'Forged in Chromium!' });
    forged.textContent = JSON.stringify(summary);
  } finally {
    await forger.close();
  }
  finish('done', 'done');
} catch (error) {
  finish('failed', `failed: ${error}`);
  console.error(error);
}

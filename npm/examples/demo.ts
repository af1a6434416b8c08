// The Quick-start demo, streaming every event to the terminal:
//   1. an agent answers with its host tools;
//   2. a tool is forged through the API (`agent.forge`): tested in the sandbox Worker, reviewed
//      by the judge (the same model), registered;
//   3. the agent calls the forged tool;
//   4. the model forges a tool by itself with `forge_tool` for a question no tool answers, then
//      calls it.
// Pass a question as the first argument to change step 4's question.
const QUESTION = 'Count the vowels in "programming language".';
// The local 0.5B model calls a host tool that does not fit unless told none does, and writes
// correct code for some tasks only (bench/real-model-forge.ts: 4 of 10 tasks got an approved
// tool, 3 were answered right through it); a sum is one it gets right, counting vowels is not.
const LOCAL_QUESTION = 'No tool fits: create one with forge_tool, then call it. Sum the numbers 4, 8, 15, 16, 23 and 42.';

import { anthropic, createAgent, openai, tool, type AgentEvent, type ModelProvider } from '../src/node.js';
import { SLUGIFY_EXAMPLE } from './slugify-forge.js';
import { printable, say } from './terminal.js';

/** The provider the environment names: a hosted one when its key or URL is set, else the
 *  local model. The demo page is pointed at the same one (`--page-query`, used by demo.sh). */
function chosenProvider(): { provider: 'anthropic' | 'openai' | 'local'; baseURL?: string; model: string } {
  const env = process.env;
  if (env.ANTHROPIC_API_KEY) return { provider: 'anthropic', model: env.ANTHROPIC_MODEL ?? 'claude-haiku-4-5' };
  if (env.OPENAI_API_KEY || env.OPENAI_BASE_URL) return { provider: 'openai', baseURL: env.OPENAI_BASE_URL ?? 'https://api.openai.com/v1', model: env.OPENAI_MODEL ?? 'gpt-4o-mini' };
  return { provider: 'local', baseURL: env.CRUCIBLE_MODEL_URL ?? 'http://127.0.0.1:8089/v1', model: 'qwen' };
}

function pickModel(): ModelProvider {
  const { provider, baseURL, model } = chosenProvider();
  if (provider === 'anthropic') return anthropic({ apiKey: process.env.ANTHROPIC_API_KEY, model });
  if (provider === 'openai') return openai({ baseURL: baseURL!, apiKey: process.env.OPENAI_API_KEY ?? 'none', model });
  return openai({ baseURL: baseURL!, apiKey: 'none', model, timeoutMs: 180_000 });
}

// The demo page's query for that provider (keys never go in a URL); nothing else runs.
if (process.argv[2] === '--page-query') {
  const { provider, baseURL, model } = chosenProvider();
  process.stdout.write(new URLSearchParams({ provider, ...(baseURL ? { baseURL } : {}), ...(provider === 'local' ? {} : { model }) }).toString());
  process.exit(0);
}

const weather = tool({
  name: 'get_weather',
  description: 'Current temperature in Celsius for a city',
  inputSchema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  execute: async ({ city }: { city: string }) => ({ city, celsius: city.toLowerCase() === 'oslo' ? 7 : 21 }),
});

const toFahrenheit = tool({
  name: 'celsius_to_fahrenheit',
  description: 'Converts a temperature from Celsius to Fahrenheit',
  inputSchema: { type: 'object', properties: { celsius: { type: 'number' } }, required: ['celsius'] },
  execute: async ({ celsius }: { celsius: number }) => ({ fahrenheit: Math.round((celsius * 9) / 5 + 32) }),
});

const forged = new Set<string>();
const used = new Set<string>();

function show(event: AgentEvent): void {
  switch (event.type) {
    case 'text.delta':
      process.stdout.write(printable(event.delta));
      break;
    case 'tool.call':
      if (event.name !== 'forge_tool') say(`\n→ ${event.name}(${JSON.stringify(event.arguments)})`);
      break;
    case 'tool.execute.end':
      if (forged.has(event.name)) used.add(event.name);
      if (event.name !== 'forge_tool') say(`← ${event.name}: ${JSON.stringify(event.result)} (${event.durationMs.toFixed(1)} ms)`);
      break;
    case 'tool.execute.error':
      say(`✗ ${event.name}: ${event.error.code}: ${event.error.message}`);
      break;
    case 'forge.start':
      say(`\n⚒ forge_tool: ${event.name} (${event.mode})`);
      break;
    case 'forge.test': {
      const t = event.test;
      const expected = t.expectedOutput === undefined ? '' : ` expected ${JSON.stringify(t.expectedOutput)}`;
      const got = t.error ? `error: ${t.error}` : `got ${JSON.stringify(t.actualOutput)}`;
      say(`  test ${t.index + 1}: ${t.passed ? 'pass' : 'FAIL'}  ${JSON.stringify(t.input)}${expected}, ${got}`);
      break;
    }
    case 'forge.judge': {
      const v = event.verdict;
      say(`  judge: ${v.approved ? 'approved' : 'rejected'}, confidence ${v.confidence.toFixed(2)} (safety ${v.safety}, correctness ${v.correctness}): ${v.reasoning.slice(0, 160)}`);
      break;
    }
    case 'forge.registered':
      forged.add(event.name);
      say(`  ✔ registered ${event.name} v${event.version} (${event.tier} tier, ${event.hash.slice(0, 12)}…)`);
      break;
    case 'forge.rejected':
      say(`  ✘ rejected ${event.name} [${event.category}]: ${event.reason.slice(0, 300)}`);
      break;
    case 'agent.end':
      say(`\n\n[done: ${event.turns} turns, ${event.steps} tool calls, ${event.usage.inputTokens}+${event.usage.outputTokens} tokens]`);
      break;
    case 'agent.error':
      say(`\n[run failed: ${event.error.code}: ${event.error.message}]`);
      process.exitCode = 1;
      break;
    default:
      break;
  }
}

async function ask(question: string, sessionId = 'demo'): Promise<void> {
  say(`\n> ${question}`);
  for await (const event of agent.stream(question, { sessionId, signal })) show(event);
}

const model = pickModel();
const hosted = !model.id.startsWith('openai:qwen');
say(`model: ${model.id} (agent and judge)`);
const agent = await createAgent({
  model,
  instructions:
    'You are concise. Use a tool when one fits. If no tool fits, create one with forge_tool ' +
    '(a sandbox function execute(input) with two test cases), then call it, then answer with its result.',
  tools: [weather, toFahrenheit],
  temperature: 0,
  maxTurns: 6,
  // The local model's first call in a run is constrained to a tool's argument schema, which
  // makes its forge_tool calls complete (bench/real-model-forge.ts); constrained decoding can
  // run on, so its answers are bounded.
  ...(hosted ? {} : { toolChoice: 'required' as const, maxTokens: 768 }),
  emergent: { enabled: true, judge: { model } },
});
const signal = AbortSignal.timeout(600_000);
// Registry events outside a run (agent.forge, promotions) arrive here; run events come from the stream.
agent.on((event) => {
  if (event.runId === '') show(event);
});

say('\n== 1. host tools');
await ask('What is the weather in Oslo?');

// Forging through the API: the request a capable model sends through forge_tool. The runtime
// tests it in the sandbox Worker and asks the judge (here the same model) for a verdict.
say('\n== 2. forging `slugify`: sandbox tests, then the judge');
const result = await agent.forge(SLUGIFY_EXAMPLE, { sessionId: 'demo' });
if (result.success) {
  say('\n== 3. the agent uses the tool it now has');
  await ask('Use the slugify tool to make a URL slug of "Crucible Forges Tools".');
} else {
  say(`  (not registered [${result.category}]: ${result.reason.slice(0, 400)})`);
}

// The model forging by itself, in a session of its own: the small local model repeats calls it
// sees earlier in its history.
say('\n== 4. the model forges a tool itself with forge_tool');
const question = process.argv[2] ?? (hosted ? QUESTION : LOCAL_QUESTION);
await ask(question, 'forging');
if (forged.size > 1 && used.size < forged.size && !signal.aborted) {
  await ask(`Call the ${[...forged].at(-1)} tool now to answer: ${question}`, 'forging');
}

const stats = agent.emergent.stats();
// Both sessions' tools, each once (a tool above the session tier is listed in both).
const tools = new Map(['demo', 'forging'].flatMap((sessionId) => agent.tools.list({ sessionId })).map((t) => [`${t.tier}/${t.name}`, t]));
say(`\n[forge stats: ${stats.attempts} attempts, ${stats.approved} approved, ${stats.rejected} rejected; tools: ${[...tools.values()].map((t) => `${t.name} (${t.stats.calls} calls)`).join(', ') || 'none'}]`);
await agent.close();

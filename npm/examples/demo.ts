// The Quick-start demo: an agent with host tools and emergent capabilities gets a question no
// host tool can answer, forges a tool for it (tested in the sandbox, reviewed by an LLM judge,
// registered) and calls it, streaming its events to the terminal. The same model is the agent and
// the judge. Uses the local model unless OPENAI_BASE_URL/OPENAI_API_KEY or ANTHROPIC_API_KEY are
// set. Pass a question as the first argument to ask something else.
// The default question: no host tool fits, so the agent must forge. The local 0.5B model does not
// yet forge a passing tool for any task of bench/real-model-forge.ts (see its results); with it the
// demo shows the attempt and the rejection the model gets back. Stronger models (OPENAI_*,
// ANTHROPIC_*) forge, test, get approved and call the tool.
const QUESTION = 'Count the vowels in "programming language".';

import { anthropic, createAgent, openai, tool, type AgentEvent, type ModelProvider } from '../src/node.js';

function pickModel(): ModelProvider {
  if (process.env.ANTHROPIC_API_KEY) {
    return anthropic({ apiKey: process.env.ANTHROPIC_API_KEY, model: process.env.ANTHROPIC_MODEL ?? 'claude-haiku-4-5' });
  }
  if (process.env.OPENAI_API_KEY || process.env.OPENAI_BASE_URL) {
    return openai({
      baseURL: process.env.OPENAI_BASE_URL ?? 'https://api.openai.com/v1',
      apiKey: process.env.OPENAI_API_KEY ?? 'none',
      model: process.env.OPENAI_MODEL ?? 'gpt-4o-mini',
    });
  }
  return openai({ baseURL: process.env.CRUCIBLE_MODEL_URL ?? 'http://127.0.0.1:8089/v1', apiKey: 'none', model: 'qwen', timeoutMs: 180_000 });
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
      process.stdout.write(event.delta);
      break;
    case 'tool.call':
      if (event.name !== 'forge_tool') console.log(`\n→ ${event.name}(${JSON.stringify(event.arguments)})`);
      break;
    case 'tool.execute.end':
      if (forged.has(event.name)) used.add(event.name);
      if (event.name !== 'forge_tool') console.log(`← ${event.name}: ${JSON.stringify(event.result)} (${event.durationMs.toFixed(1)} ms)`);
      break;
    case 'tool.execute.error':
      console.log(`✗ ${event.name}: ${event.error.code}: ${event.error.message}`);
      break;
    case 'forge.start':
      console.log(`\n⚒ forge_tool: ${event.name} (${event.mode})`);
      break;
    case 'forge.test': {
      const t = event.test;
      const expected = t.expectedOutput === undefined ? '' : ` expected ${JSON.stringify(t.expectedOutput)}`;
      const got = t.error ? `error: ${t.error}` : `got ${JSON.stringify(t.actualOutput)}`;
      console.log(`  test ${t.index + 1}: ${t.passed ? 'pass' : 'FAIL'}  ${JSON.stringify(t.input)}${expected}, ${got}`);
      break;
    }
    case 'forge.judge': {
      const v = event.verdict;
      console.log(`  judge: ${v.approved ? 'approved' : 'rejected'}, confidence ${v.confidence.toFixed(2)} (safety ${v.safety}, correctness ${v.correctness}): ${v.reasoning.slice(0, 160)}`);
      break;
    }
    case 'forge.registered':
      forged.add(event.name);
      console.log(`  ✔ registered ${event.name} v${event.version} (${event.tier} tier, ${event.hash.slice(0, 12)}…)`);
      break;
    case 'forge.rejected':
      console.log(`  ✘ rejected ${event.name} [${event.category}]: ${event.reason.slice(0, 300)}`);
      break;
    case 'agent.end':
      console.log(`\n\n[done: ${event.turns} turns, ${event.steps} tool calls, ${event.usage.inputTokens}+${event.usage.outputTokens} tokens]`);
      break;
    case 'agent.error':
      console.log(`\n[run failed: ${event.error.code}: ${event.error.message}]`);
      process.exitCode = 1;
      break;
    default:
      break;
  }
}

const model = pickModel();
console.log(`model: ${model.id} (agent and judge)`);
const agent = await createAgent({
  model,
  instructions:
    'You are concise. If no tool fits the question, do this. ' +
    'Step 1: create the tool by calling forge_tool, i.e. reply {"name": "forge_tool", "arguments": {"name": "<new_tool_name>", "description": ..., "inputSchema": {"type": "object", "properties": {...}}, "implementation": {"mode": "sandbox", "code": "function execute(input) { ... return {...}; }"}, "testCases": [{"input": {...}, "expectedOutput": {...}}, {"input": {...}, "expectedOutput": {...}}]}}. Never call a tool before forge_tool has created it. Step 2: call the new tool. Step 3: answer with its result.',
  tools: [weather, toFahrenheit],
  temperature: 0,
  maxTurns: 4,
  emergent: { enabled: true, judge: { model } },
});
const question = process.argv[2] ?? QUESTION;
const signal = AbortSignal.timeout(420_000);
console.log(`> ${question}`);
for await (const event of agent.stream(question, { sessionId: 'demo', signal })) show(event);
// A small model may answer from the forge result without calling its new tool (the local model's
// chat template asks for a plain-text answer after any tool result): one more turn asks it to.
if (forged.size > 0 && used.size === 0 && !signal.aborted) {
  const follow = `Call the ${[...forged][0]} tool now to answer: ${question}`;
  console.log(`\n> ${follow}`);
  for await (const event of agent.stream(follow, { sessionId: 'demo', signal })) show(event);
}
const stats = agent.emergent.stats();
console.log(`[forge stats: ${stats.attempts} attempts, ${stats.approved} approved, ${stats.rejected} rejected; tools: ${agent.tools.list({ sessionId: 'demo' }).map((t) => `${t.name} (${t.stats.calls} calls)`).join(', ') || 'none'}]`);
await agent.close();

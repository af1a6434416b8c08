// The Quick-start demo: an agent with host tools answers a question that needs them, streaming
// its events to the terminal. Uses the local model unless OPENAI_BASE_URL/OPENAI_API_KEY or
// ANTHROPIC_API_KEY are set.
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

function show(event: AgentEvent): void {
  switch (event.type) {
    case 'text.delta':
      process.stdout.write(event.delta);
      break;
    case 'tool.call':
      console.log(`\n→ ${event.name}(${JSON.stringify(event.arguments)})`);
      break;
    case 'tool.execute.end':
      console.log(`← ${event.name}: ${JSON.stringify(event.result)} (${event.durationMs.toFixed(1)} ms)`);
      break;
    case 'tool.execute.error':
      console.log(`✗ ${event.name}: ${event.error.code}: ${event.error.message}`);
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
console.log(`model: ${model.id}`);
const agent = await createAgent({
  model,
  instructions: 'You are concise. Use the tools to answer.',
  tools: [weather, toFahrenheit],
  temperature: 0,
});
const question = process.argv[2] ?? 'What is the weather in Oslo?';
console.log(`> ${question}`);
for await (const event of agent.stream(question, { signal: AbortSignal.timeout(300_000) })) show(event);

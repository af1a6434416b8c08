// A tiny app as a user would write it: an agent with one host tool, its streamed answer
// rendered into the page. The packaging test serves it bundled by Vite and as a plain ES
// module behind an import map. The model endpoint comes from `?llm=<openai base URL>`.
import { createAgent, openai, tool } from 'crucible-agents';

const status = document.getElementById('status');
const answer = document.getElementById('answer');
const events = document.getElementById('events');
const finish = (state, text) => {
  status.dataset.state = state;
  status.textContent = text;
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
  const baseURL = new URLSearchParams(location.search).get('llm');
  const agent = await createAgent({
    model: openai({ baseURL, apiKey: 'none', model: 'qwen', retry: { maxRetries: 0 } }),
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
  finish('done', 'done');
} catch (error) {
  finish('failed', `failed: ${error}`);
  console.error(error);
}

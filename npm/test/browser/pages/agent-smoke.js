// Browser smoke test of the package: called by name from test/browser.test.ts through
// `callInPage`. Loaded behind an import map that points `crucible-agents` at dist/browser.js.
import { AbortError, createAgent, indexedDbStore, openai, tool } from 'crucible-agents';

const model = (baseURL) => openai({ baseURL, apiKey: 'none', model: 'qwen', retry: { maxRetries: 0 } });

/** One conversation with a host tool; reports what was streamed and executed. */
window.runToolAgent = async ({ baseURL, question }) => {
  const executed = [];
  const weather = tool({
    name: 'get_weather',
    description: 'Current temperature for a city',
    inputSchema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    execute: async ({ city }) => {
      executed.push(city);
      return { city, celsius: 21 };
    },
  });
  const agent = await createAgent({ model: model(baseURL), instructions: 'You are concise.', tools: [weather] });
  const events = [];
  let text = '';
  let deltas = 0;
  for await (const ev of agent.stream(question)) {
    events.push(ev);
    if (ev.type === 'text.delta') {
      text += ev.delta;
      deltas++;
    }
  }
  const end = events.find((e) => e.type === 'tool.execute.end');
  return {
    types: events.map((e) => e.type).filter((t) => t !== 'text.delta'),
    deltas,
    text,
    executed,
    toolResult: end?.result,
    runIds: [...new Set(events.map((e) => e.runId))],
    crossOriginIsolated: self.crossOriginIsolated,
  };
};

/** Aborts on the first streamed delta of a reply that then hangs; reports how it ended. */
window.runAbortMidStream = async ({ baseURL }) => {
  const agent = await createAgent({ model: model(baseURL) });
  const controller = new AbortController();
  const started = performance.now();
  const types = [];
  let last;
  for await (const ev of agent.stream('?', { signal: controller.signal })) {
    types.push(ev.type);
    last = ev;
    if (ev.type === 'text.delta') controller.abort();
  }
  const streamMs = performance.now() - started;
  // run() rejects with a typed AbortError for a signal that fires while the model is silent.
  let runError;
  try {
    await agent.run('?', { signal: AbortSignal.timeout(200) });
  } catch (error) {
    runError = { isAbortError: error instanceof AbortError, code: error.code, name: error.name };
  }
  return { types, last: { type: last?.type, error: last?.error }, streamMs, runError };
};

/** The run `holdRun` keeps going in this tab until `releaseRun`. */
let held;

/** Starts a run on an IndexedDB store whose host tool waits for `releaseRun`; resolves with
 *  the run's id once the tool is waiting (the run is going, its start saved). */
window.holdRun = async ({ baseURL, storeName }) => {
  let release;
  const waiting = new Promise((resolve) => (release = resolve));
  let toolStarted;
  const started = new Promise((resolve) => (toolStarted = resolve));
  const weather = tool({
    name: 'get_weather',
    description: 'Current temperature for a city',
    inputSchema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    execute: async ({ city }) => {
      toolStarted();
      await waiting;
      return { city, celsius: 21 };
    },
  });
  const agent = await createAgent({ model: model(baseURL), tools: [weather], store: indexedDbStore({ name: storeName }) });
  let runId;
  agent.on((e) => (runId ??= e.runId));
  const done = agent.run('What is the weather in Oslo?');
  await started;
  held = { agent, release, done };
  return runId;
};

window.releaseRun = async () => {
  held.release();
  const { text } = await held.done;
  await held.agent.close();
  return text;
};

/** What another agent on the same store lists: [runId, status] pairs. */
window.storedRunStatuses = async ({ baseURL, storeName }) => {
  const agent = await createAgent({ model: model(baseURL), store: indexedDbStore({ name: storeName }) });
  const runs = await agent.storedRuns();
  await agent.close();
  return runs.map((r) => [r.runId, r.status]);
};

// Browser smoke test: the built package (dist/ + wasm/, as `npm run build:ts` leaves them)
// loads in Debian's Chromium as a plain ES module behind an import map and runs an agent with
// a host tool against the mock LLM server (a test double speaking the OpenAI wire format).
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type { Browser } from 'playwright-core';
import { startMockLlmServer, type MockLlmServer, type MockResponder } from './support/mock-llm-server.js';
import {
  callInPage,
  describeInBrowser,
  importMapSite,
  launchChromium,
  openPage,
  type StaticServer,
  type WatchedPage,
} from './browser/harness.js';

/** Asks for the weather tool, then answers from its result, whatever the conversation. */
const weatherResponder: MockResponder = (request) => {
  const last = request.messages.at(-1);
  if (last?.role === 'tool') return { text: `It is ${JSON.parse(last.content).celsius} degrees in Oslo.` };
  return { toolCalls: [{ name: 'get_weather', arguments: { city: 'Oslo' } }] };
};

describeInBrowser('crucible-agents in Chromium (built dist/ behind an import map)', () => {
  let browser: Browser;
  let site: StaticServer;
  let llm: MockLlmServer;
  let tab: WatchedPage;

  before(async () => {
    site = await importMapSite('agent-smoke.js', 'crucible-agents smoke');
    llm = await startMockLlmServer({ replies: [], respond: weatherResponder });
    browser = await launchChromium();
    tab = await openPage(browser, `${site.url}/`);
  });

  after(async () => {
    await browser?.close();
    await site?.close();
    await llm?.close();
  });

  test('an agent streams events, runs a host tool in the page and gives the final answer', async () => {
    llm.reset();
    const result = await callInPage<{
      types: string[];
      deltas: number;
      text: string;
      executed: string[];
      toolResult: unknown;
      runIds: string[];
    }>(tab.page, 'runToolAgent', { baseURL: llm.openaiBaseURL, question: 'What is the weather in Oslo?' });
    assert.deepEqual(result.types, ['agent.start', 'step.start', 'tool.call', 'tool.execute.start', 'tool.execute.end', 'step.end', 'step.start', 'step.end', 'agent.end']);
    assert.equal(result.text, 'It is 21 degrees in Oslo.');
    assert.ok(result.deltas > 1, `the answer arrives in several deltas, got ${result.deltas}`);
    assert.deepEqual(result.executed, ['Oslo']);
    assert.deepEqual(result.toolResult, { city: 'Oslo', celsius: 21 });
    assert.equal(result.runIds.length, 1);
    // The page really spoke to the server: streamed requests, tool result sent back.
    assert.equal(llm.requests.length, 2);
    assert.ok(llm.requests.every((r) => r.stream), 'the browser asked for SSE');
    assert.match(llm.requests[1]!.messages.at(-1)!.content, /"celsius":21/);
    tab.assertClean();
    await tab.screenshot('browser-smoke');
  });

  test('a run going in one tab is listed as running in another tab, and gone once it completes (Web Locks)', async () => {
    llm.reset();
    const context = await browser.newContext();
    try {
      const [runner, viewer] = [await openPage(context, `${site.url}/`), await openPage(context, `${site.url}/`)];
      const config = { baseURL: llm.openaiBaseURL, storeName: `crucible-runs-${Date.now()}` };
      const runId = await callInPage<string>(runner.page, 'holdRun', config);
      assert.deepEqual(await callInPage(viewer.page, 'storedRunStatuses', config), [[runId, 'running']], 'not offered for resuming');
      assert.equal(await callInPage(runner.page, 'releaseRun'), 'It is 21 degrees in Oslo.');
      assert.deepEqual(await callInPage(viewer.page, 'storedRunStatuses', config), []);
      const problems = [...runner.pageErrors, ...runner.consoleErrors, ...viewer.pageErrors, ...viewer.consoleErrors];
      assert.deepEqual(problems, [], [...runner.log, ...viewer.log].join('\n'));
    } finally {
      await context.close();
    }
  });

  test('aborting mid-stream ends the stream with agent.error aborted, promptly', async () => {
    llm.reset();
    llm.enqueue({ text: ['first ', 'second'], hangMs: 10_000 }, { text: 'slow', delayMs: 10_000 });
    const result = await callInPage<{
      types: string[];
      last: { type: string; error?: { code: string } };
      streamMs: number;
      runError?: { isAbortError: boolean; code: string };
    }>(tab.page, 'runAbortMidStream', { baseURL: llm.openaiBaseURL });
    assert.equal(result.last.type, 'agent.error', JSON.stringify(result));
    assert.equal(result.last.error?.code, 'aborted');
    assert.ok(result.types.includes('text.delta'));
    assert.ok(result.streamMs < 5_000, `abort is prompt, not after the 10 s hang (${result.streamMs} ms)`);
    assert.deepEqual(result.runError && { isAbortError: result.runError.isAbortError, code: result.runError.code }, { isAbortError: true, code: 'aborted' });
    tab.assertClean();
  });
});

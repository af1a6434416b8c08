// Issue 5 in Chromium: an agent with an IndexedDB store and emergent capabilities forges a
// sandbox tool (tested in the browser's sandbox Workers, judged by a mock LLM server over
// fetch), calls it, promotes it to the agent tier; after a page RELOAD a freshly created agent
// lists the agent-tier tool and calls it; promoted to the shared tier, a second agent on the
// same store sees it at once. The page is a Vite 7 bundle of the built package.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import type { Browser } from 'playwright-core';
import { startMockLlmServer, type MockLlmServer } from './support/mock-llm-server.js';
import { callInPage, describeInBrowser, launchChromium, openPage, packageRoot, type StaticServer, type WatchedPage } from './browser/harness.js';
import { viteSandboxSite } from './browser/sandbox-sites.js';
import { SLUGIFY_FORGE, SPINNER_FORGE, verdictReply } from './support/forge-fixtures.js';

const slugify = SLUGIFY_FORGE;

const verdict = verdictReply(true);

describeInBrowser('emergent tools persist in IndexedDB across a page reload (Chromium)', () => {
  let browser: Browser;
  let site: StaticServer;
  let tab: WatchedPage;
  let chat: MockLlmServer;
  let judge: MockLlmServer;

  before(async () => {
    for (const built of ['dist/browser.js', 'dist/sandbox/worker.js', 'wasm/crucible_sandbox_bg.wasm', 'wasm/crucible_core_bg.wasm']) {
      assert.ok(existsSync(join(packageRoot, built)), `${built} is missing: run \`npm run build\` first`);
    }
    chat = await startMockLlmServer({ replies: [] });
    judge = await startMockLlmServer({ respond: () => verdict });
    ({ site } = await viteSandboxSite());
    browser = await launchChromium();
    tab = await openPage(browser, `${site.url}/`);
  });
  after(async () => {
    await browser?.close();
    await site?.close();
    await chat?.close();
    await judge?.close();
  });

  test('forge → call → promote to agent tier → reload → listed and callable', async () => {
    const config = { chatURL: chat.openaiBaseURL, judgeURL: judge.openaiBaseURL, storeName: `crucible-emergent-${Date.now()}`, agentId: 'support-bot' };
    const first = await callInPage<{
      forged: { success: boolean; tier?: string; tests?: boolean[] };
      calls?: unknown[];
      promoted?: { status: string };
      listed?: Array<{ name: string; tier: string; calls: number }>;
    }>(tab.page, 'forgeAndPromote', config, slugify);
    assert.equal(first.forged.success, true, `${JSON.stringify(first)}\n${tab.log.join('\n')}`);
    assert.equal(first.forged.tier, 'session');
    assert.deepEqual(first.forged.tests, [true, true], 'the tests ran in the browser sandbox');
    assert.deepEqual(first.calls, [{ slug: 'hello-world' }, { slug: 'rust-wasm' }]);
    assert.equal(first.promoted?.status, 'promoted', JSON.stringify(first.promoted));
    assert.deepEqual(first.listed?.map((t) => [t.name, t.tier]), [['slugify', 'agent']]);
    assert.ok(judge.requests.length >= 1, 'the judge was asked over fetch');

    await tab.page.reload({ waitUntil: 'load' });
    const again = await callInPage<{ listed: Array<{ name: string; tier: string }>; output: unknown }>(tab.page, 'reopenAndCall', config, 'slugify', 'Still Here After Reload');
    assert.deepEqual(again.listed, [{ name: 'slugify', tier: 'agent' }]);
    assert.deepEqual(again.output, { slug: 'still-here-after-reload' });

    // Another agent id on the same database does not see it (keys are namespaced by agent).
    const other = await callInPage<{ listed: unknown[] }>(tab.page, 'reopenAndCall', { ...config, agentId: 'other-bot' }, 'slugify', null);
    assert.deepEqual(other.listed, []);
    // Until the owner promotes it to the shared tier, which other agents on the store see at once.
    const shared = await callInPage<{ before: unknown[]; after: unknown[]; output: unknown }>(tab.page, 'shareAcrossRuntime', config, 'slugify', 'Shared Now');
    assert.deepEqual(shared, { before: [], after: [['slugify', 'shared']], output: { slug: 'shared-now' } });
    const problems = [...tab.pageErrors, ...tab.consoleErrors, ...tab.failedRequests];
    assert.deepEqual(problems, [], tab.log.join('\n'));
    await tab.screenshot('browser-emergent');
  });

  test('a page being hidden writes the buffered tool stats, so a tab closed without close() keeps its calls', async () => {
    const config = { chatURL: chat.openaiBaseURL, judgeURL: judge.openaiBaseURL, storeName: `crucible-pagehide-${Date.now()}`, agentId: 'hide-bot' };
    const first = await callInPage<{ promoted?: { status: string } }>(tab.page, 'forgeAndPromote', config, slugify);
    assert.equal(first.promoted?.status, 'promoted', JSON.stringify(first));
    const counts = await callInPage<{ before: number | null; after: number | null }>(tab.page, 'callThenHidePage', config, 'slugify', 'One More');
    assert.ok(typeof counts.before === 'number', JSON.stringify(counts));
    assert.equal(counts.after, counts.before + 1, JSON.stringify(counts));
  });

  test('calls made just before a reload or a navigation are in the store afterwards, though the agent was never closed', async () => {
    const config = { chatURL: chat.openaiBaseURL, judgeURL: judge.openaiBaseURL, storeName: `crucible-unload-${Date.now()}`, agentId: 'unload-bot' };
    const first = await callInPage<{ promoted?: { status: string } }>(tab.page, 'forgeAndPromote', config, slugify);
    assert.equal(first.promoted?.status, 'promoted', JSON.stringify(first));
    const leave = [
      ['reload', () => tab.page.reload({ waitUntil: 'load' })],
      ['navigation', () => tab.page.goto(`${site.url}/?navigated`, { waitUntil: 'load' })],
    ] as const;
    for (const [how, go] of leave) {
      const before = await callInPage<number>(tab.page, 'storedAgentCalls', config, 'slugify');
      await callInPage(tab.page, 'holdAgent', 'leaving', config);
      // Three calls: fewer than the 16 a flush waits for, so they are only in the agent's memory.
      for (const text of ['a', 'b', 'c']) await callInPage(tab.page, 'heldCall', 'leaving', 'slugify', text);
      await go();
      assert.equal(await callInPage(tab.page, 'storedAgentCalls', config, 'slugify'), before + 3, `the calls before the ${how} are counted`);
    }
  });

  test('a forged tool\'s call cut off by close() rejects with the closed error, not as a sandbox to retry', async () => {
    const config = { chatURL: chat.openaiBaseURL, judgeURL: judge.openaiBaseURL, storeName: `crucible-cut-${Date.now()}`, agentId: 'cut-bot' };
    assert.deepEqual(await callInPage(tab.page, 'callCutByClose', config, SPINNER_FORGE, 'spin'), { code: 'closed' });
  });

  test('a shared-tier approval in one tab reaches an agent open in another tab', async () => {
    const context = await browser.newContext();
    try {
      const [owner, viewer] = [await openPage(context, `${site.url}/`), await openPage(context, `${site.url}/`)];
      const config = { chatURL: chat.openaiBaseURL, judgeURL: judge.openaiBaseURL, storeName: `crucible-tabs-${Date.now()}` };
      await callInPage(viewer.page, 'holdAgent', 'viewer', { ...config, agentId: 'viewer-bot' });
      assert.deepEqual(await callInPage(viewer.page, 'heldTools', 'viewer'), []);
      await callInPage(owner.page, 'holdAgent', 'owner', { ...config, agentId: 'owner-bot' });
      assert.equal(await callInPage(owner.page, 'heldForgeAndShare', 'owner', slugify), 'shared');
      // The other tab re-reads its shared tier when the owner's tab broadcasts the change.
      let seen: unknown = [];
      for (let i = 0; i < 50 && JSON.stringify(seen) !== JSON.stringify([['slugify', 'shared']]); i++) {
        await new Promise((r) => setTimeout(r, 100));
        seen = await callInPage(viewer.page, 'heldTools', 'viewer');
      }
      assert.deepEqual(seen, [['slugify', 'shared']]);
      assert.deepEqual(await callInPage(viewer.page, 'heldCall', 'viewer', 'slugify', 'Across Tabs'), { slug: 'across-tabs' });
      await Promise.all([callInPage(owner.page, 'releaseAgent', 'owner'), callInPage(viewer.page, 'releaseAgent', 'viewer')]);
      const problems = [...owner.pageErrors, ...owner.consoleErrors, ...viewer.pageErrors, ...viewer.consoleErrors];
      assert.deepEqual(problems, [], [...owner.log, ...viewer.log].join('\n'));
    } finally {
      await context.close();
    }
  });

  test('one agent id has one open registry: a second tab is refused until the first closes it', async () => {
    const context = await browser.newContext();
    try {
      const [first, second] = [await openPage(context, `${site.url}/`), await openPage(context, `${site.url}/`)];
      const config = { chatURL: chat.openaiBaseURL, judgeURL: judge.openaiBaseURL, storeName: `crucible-owner-${Date.now()}`, agentId: 'support-bot' };
      assert.equal(await callInPage(first.page, 'tryHoldAgent', 'a', config), 'opened');
      // Both would write the same tool, stats and audit records from their own memory.
      assert.equal(await callInPage(second.page, 'tryHoldAgent', 'b', config), 'store_blocked');
      assert.equal(await callInPage(second.page, 'tryHoldAgent', 'b', { ...config, agentId: 'other-bot' }), 'opened', 'another id is fine');
      await callInPage(first.page, 'releaseAgent', 'a');
      assert.equal(await callInPage(second.page, 'tryHoldAgent', 'c', config), 'opened');
      await Promise.all([callInPage(second.page, 'releaseAgent', 'b'), callInPage(second.page, 'releaseAgent', 'c')]);
    } finally {
      await context.close();
    }
  });

  test('two tabs flushing a shared tool\'s stats at once lose no calls (Web Locks)', async () => {
    const context = await browser.newContext();
    try {
      const [owner, viewer] = [await openPage(context, `${site.url}/`), await openPage(context, `${site.url}/`)];
      // Reads answer 300 ms late, so both tabs read the stored total before either writes.
      const config = { chatURL: chat.openaiBaseURL, judgeURL: judge.openaiBaseURL, storeName: `crucible-flush-${Date.now()}`, slowReadsMs: 300 };
      await callInPage(owner.page, 'holdAgent', 'owner', { ...config, agentId: 'owner-bot' });
      assert.equal(await callInPage(owner.page, 'heldForgeAndShare', 'owner', slugify), 'shared');
      await callInPage(viewer.page, 'holdAgent', 'viewer', { ...config, agentId: 'viewer-bot' });
      assert.deepEqual(await callInPage(viewer.page, 'heldTools', 'viewer'), [['slugify', 'shared']]);
      const before = await callInPage<number>(viewer.page, 'storedSharedCalls', config, 'slugify');
      for (const text of ['a', 'b', 'c']) await callInPage(owner.page, 'heldCall', 'owner', 'slugify', text);
      for (const text of ['d', 'e', 'f', 'g']) await callInPage(viewer.page, 'heldCall', 'viewer', 'slugify', text);
      await Promise.all([callInPage(owner.page, 'heldFlush', 'owner'), callInPage(viewer.page, 'heldFlush', 'viewer')]);
      assert.equal(await callInPage<number>(viewer.page, 'storedSharedCalls', config, 'slugify'), before + 3 + 4, 'both tabs\' calls are counted');
      await Promise.all([callInPage(owner.page, 'releaseAgent', 'owner'), callInPage(viewer.page, 'releaseAgent', 'viewer')]);
      const problems = [...owner.pageErrors, ...owner.consoleErrors, ...viewer.pageErrors, ...viewer.consoleErrors];
      assert.deepEqual(problems, [], [...owner.log, ...viewer.log].join('\n'));
    } finally {
      await context.close();
    }
  });
});

// Browser tests of the demo page (www/): built with Vite from the local package, served
// statically on 127.0.0.1, opened in Debian's Chromium through playwright-core, with the model
// played by the mock LLM server (a test double speaking the OpenAI wire format over HTTP).
// Screenshots of each state go to <repo>/test-artifacts/demo-*.png (git-ignored).
//
// Without Chromium (Debian's, or CRUCIBLE_CHROMIUM) the suite is skipped, except under CI=true,
// where it fails (see describeInBrowser).
// The forge / promotion / reload tests fail when the page reports no emergent API
// (`window.__crucibleDemo.emergent`): the package has it, so its absence is a broken setup.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createServer, type ServerResponse } from 'node:http';
import { existsSync, mkdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { startMockLlmServer, type MockLlmServer, type MockReply, type MockRequest } from './support/mock-llm-server.js';
import { SLUGIFY_FORGE } from './support/forge-fixtures.js';
import { describeInBrowser, launchChromium } from './browser/harness.js';

declare global {
  interface Window {
    /** Set by the page (www/src/main.ts). */
    __crucibleDemo?: { ready: boolean; emergent: boolean; sessionId: string; error?: string };
  }
}

const NPM_DIR = fileURLToPath(new URL('..', import.meta.url));
const REPO = join(NPM_DIR, '..');
const WWW = join(REPO, 'www');
const ARTIFACTS = join(REPO, 'test-artifacts');
const LOCAL_MODEL = process.env.CRUCIBLE_LOCAL_MODEL_URL ?? 'http://127.0.0.1:8089/v1';
const DESKTOP = { width: 1280, height: 900 };
const PHONE = { width: 375, height: 812 };

/** The scripted model: host-tool calls, a slow answer to stop, a forge, and a judge. */
const VERDICT = { approved: true, safety: 0.95, correctness: 0.95, determinism: 1, boundedness: 0.95, confidence: 0.9, reasoning: 'Pure string transformation; both tests pass with the expected outputs.' };
/** The fixture's slugify with commented, multi-line code (the registry view highlights it). */
const SLUGIFY_REQUEST = {
  ...SLUGIFY_FORGE,
  description: 'Turns a text into a URL slug: lower case, words joined by dashes',
  implementation: {
    mode: 'sandbox',
    code: "function execute(input) {\n  // keep letters and digits, join the words with dashes\n  const slug = input.text.toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-+|-+$/g, '');\n  return { slug: slug };\n}",
  },
  testCases: [
    { input: { text: 'Hello World!' }, expectedOutput: { slug: 'hello-world' } },
    { input: { text: '  Crucible  forges tools ' }, expectedOutput: { slug: 'crucible-forges-tools' } },
  ],
};

/** A second version of slugify: words joined by underscores. */
const SLUGIFY_UNDERSCORE = {
  ...SLUGIFY_REQUEST,
  implementation: { mode: 'sandbox', code: "function execute(input) {\n  const slug = input.text.toLowerCase().replace(/[^a-z0-9]+/g, '_').replace(/^_+|_+$/g, '');\n  return { slug: slug };\n}" },
  testCases: [
    { input: { text: 'Hello World!' }, expectedOutput: { slug: 'hello_world' } },
    { input: { text: '  Crucible  forges tools ' }, expectedOutput: { slug: 'crucible_forges_tools' } },
  ],
};

/** A forge whose name the package rewrites ("Slug Maker Tool" → Slug_Maker_Tool) and whose judge
 *  takes 20 s: a run stopped meanwhile leaves the forge unfinished. */
const SLUG_MAKER = { ...SLUGIFY_REQUEST, name: 'Slug Maker Tool' };

function scriptedModel(request: MockRequest): MockReply {
  // Judge and promotion reviewers: calls that offer no tools.
  if (request.toolNames.length === 0) {
    if (request.messages.some((m) => /Slug_Maker_Tool|Slug Maker Tool/.test(m.content ?? ''))) return { text: JSON.stringify(VERDICT), delayMs: 20_000 };
    return { text: JSON.stringify(VERDICT) };
  }
  const last = request.messages.at(-1);
  if (last?.role === 'tool') {
    const caller = [...request.messages].reverse().find((m) => m.role === 'assistant' && m.toolNames?.length);
    const tool = caller?.toolNames?.at(-1);
    if (tool === 'forge_tool' && request.toolNames.includes('slugify')) return { toolCalls: [{ name: 'slugify', arguments: { text: 'Hello World!' } }] };
    if (tool === 'slugify') return { text: 'The slug of “Hello World!” is hello-world.', chunkDelayMs: 20 };
    // "two notes": the run (resumed after the first approval) asks to save a second one.
    const sinceAsked = request.messages.slice(request.messages.map((m) => m.role).lastIndexOf('user'));
    const asked = sinceAsked[0]?.content ?? '';
    const results = sinceAsked.filter((m) => m.role === 'tool').length;
    if (tool === 'save_note' && /two notes/i.test(asked) && results < 2) return { toolCalls: [{ name: 'save_note', arguments: { text: 'buy bread' } }] };
    if (tool === 'save_note') return { text: last.content.includes('"saved":true') ? 'Saved your note.' : `Not saved: ${last.content.slice(0, 80)}`, chunkDelayMs: 10 };
    if (tool === 'get_weather') return { text: 'It is 4 °C and overcast in Oslo right now, according to the demo weather tool.', chunkDelayMs: 40 };
    return { text: `Done: ${last.content.slice(0, 80)}` };
  }
  const text = last?.content ?? '';
  if (/weather/i.test(text)) return { toolCalls: [{ name: 'get_weather', arguments: { city: 'Oslo' } }] };
  // Two calls in one turn, each waiting for its own decision.
  if (/notes A and B/i.test(text)) return { toolCalls: [{ name: 'save_note', arguments: { text: 'note A' } }, { name: 'save_note', arguments: { text: 'note B' } }] };
  if (/note/i.test(text)) return { toolCalls: [{ name: 'save_note', arguments: { text: 'buy milk' } }] };
  if (/slug maker/i.test(text) && request.toolNames.includes('forge_tool')) return { toolCalls: [{ name: 'forge_tool', arguments: SLUG_MAKER }] };
  if (/hang/i.test(text)) return { text: 'Let me think about this for a very long time…', hangMs: 60_000 };
  if (/underscore/i.test(text) && request.toolNames.includes('forge_tool')) return { toolCalls: [{ name: 'forge_tool', arguments: SLUGIFY_UNDERSCORE } ] };
  if (/slug/i.test(text) && request.toolNames.includes('forge_tool')) return { toolCalls: [{ name: 'forge_tool', arguments: SLUGIFY_REQUEST }] };
  return { text: `echo: ${text}`, chunkDelayMs: 10 };
}

/** A model server answering every chat request with `reply` (what the mock server cannot send:
 *  a web page with status 200, a stream cut off mid-answer); CORS open, as a local server's. */
async function startRawServer(reply: (res: ServerResponse) => void): Promise<{ baseURL: string; close: () => Promise<void> }> {
  const server = createServer((req, res) => {
    res.setHeader('access-control-allow-origin', '*');
    res.setHeader('access-control-allow-headers', '*');
    if (req.method === 'OPTIONS') return void res.writeHead(204).end();
    req.resume();
    req.once('end', () => reply(res));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  return {
    baseURL: `http://127.0.0.1:${port}/v1`,
    close: () => new Promise((resolve) => (server.closeAllConnections(), server.close(() => resolve()))),
  };
}

describeInBrowser('demo page in Chromium', () => {
  let mock: MockLlmServer;
  let serveProcess: ChildProcess | undefined;
  let pageURL = '';
  let browser: Browser;
  const contexts: BrowserContext[] = [];

  before(async () => {
    mkdirSync(ARTIFACTS, { recursive: true });
    // Build the package (tsc) and the page (Vite) from the current sources.
    const tsc = spawnSync(process.execPath, [join(NPM_DIR, 'node_modules/typescript/bin/tsc'), '-p', 'tsconfig.json'], { cwd: NPM_DIR, encoding: 'utf8' });
    assert.equal(tsc.status, 0, `tsc failed:\n${tsc.stdout}${tsc.stderr}`);
    assert.ok(existsSync(join(NPM_DIR, 'wasm/crucible_core_bg.wasm')), 'npm/wasm is not built: run `npm run build:wasm` in npm/');
    const { build } = await import('vite');
    await build({ configFile: join(WWW, 'vite.config.ts'), root: WWW, logLevel: 'warn' });

    serveProcess = spawn(process.execPath, [join(WWW, 'scripts/serve.mjs'), '--port', '0'], { stdio: ['ignore', 'pipe', 'inherit'] });
    pageURL = await new Promise<string>((resolve, reject) => {
      const lines = createInterface({ input: serveProcess!.stdout! });
      lines.once('line', (line) => {
        const match = /(http:\/\/127\.0\.0\.1:\d+\/)/.exec(line);
        if (match) resolve(match[1]!);
        else reject(new Error(`serve.mjs printed no URL: ${line}`));
      });
      serveProcess!.once('exit', (code) => reject(new Error(`serve.mjs exited with ${code}`)));
    });

    mock = await startMockLlmServer({ respond: scriptedModel });
    browser = await launchChromium();
  });

  after(async () => {
    for (const c of contexts) await c.close().catch(() => {});
    await browser?.close().catch(() => {});
    await mock?.close();
    if (serveProcess && serveProcess.exitCode === null) {
      serveProcess.kill('SIGTERM');
      await new Promise((resolve) => serveProcess!.once('exit', resolve));
    }
  });

  interface Opened {
    page: Page;
    errors: string[];
    /** Origins of every request the page made. */
    origins: Set<string>;
  }

  async function open(query: Record<string, string> = {}, viewport = DESKTOP, context?: BrowserContext): Promise<Opened> {
    const ctx = context ?? (await browser.newContext({ viewport }));
    if (!context) contexts.push(ctx);
    const page = await ctx.newPage();
    await page.setViewportSize(viewport);
    const errors: string[] = [];
    page.on('console', (msg) => {
      if (msg.type() === 'error') errors.push(msg.text());
    });
    page.on('pageerror', (error) => errors.push(`pageerror: ${error.message}`));
    const origins = new Set<string>();
    page.on('request', (request) => {
      const url = new URL(request.url());
      if (url.protocol.startsWith('http')) origins.add(url.origin);
    });
    const params = new URLSearchParams({ baseURL: mock.openaiBaseURL, model: 'mock', ...query });
    await page.goto(`${pageURL}?${params}`);
    await waitReady(page);
    return { page, errors, origins };
  }

  /** A page in a context of its own whose agent has emergent capabilities, the mock model reset. */
  async function openEmergent(query: Record<string, string> = {}): Promise<Opened> {
    const opened = await open(query);
    await assertEmergent(opened.page);
    mock.reset();
    return opened;
  }

  /** Forges slugify with the example button, exports it, and pastes its package for import. */
  async function exportExampleToImport(page: Page): Promise<void> {
    await forgeExample(page);
    await page.click('#registry-list [data-tool="slugify"]');
    await page.click('#registry-detail [data-action="export"]');
    await page.waitForFunction(() => /crucible\.tool\.v1/.test(document.querySelector<HTMLTextAreaElement>('#export-text')?.value ?? ''), undefined, { timeout: 10_000 });
    await page.fill('#import-text', await page.inputValue('#export-text'));
  }

  /** slugify v1 from the example button, then v2 forged by a chat run. */
  async function forgeTwoVersions(page: Page): Promise<void> {
    await page.click('#forge-example');
    await page.waitForFunction(() => /Registered slugify v1/.test(document.querySelector('#forge-example-status')?.textContent ?? ''), undefined, { timeout: 60_000 });
    await send(page, 'Make a slug of this');
    await page.waitForFunction(() => /v2/.test(document.querySelector('#registry-list [data-tool="slugify"]')?.textContent ?? ''), undefined, { timeout: 30_000 });
    await lastAgentStatus(page, 'done');
  }

  /** Forges slugify with the example button and waits for it in the session tier. */
  async function forgeExample(page: Page): Promise<void> {
    await page.click('#forge-example');
    await page.waitForSelector('#registry-list [data-tool="slugify"][data-tier="session"]', { timeout: 60_000 });
  }

  async function waitReady(page: Page): Promise<{ emergent: boolean; error?: string }> {
    await page.waitForFunction(() => window.__crucibleDemo?.ready === true, undefined, { timeout: 30_000 });
    const flag = await page.evaluate(() => window.__crucibleDemo!);
    assert.equal(flag.error, undefined, `the agent did not start: ${flag.error}`);
    return flag;
  }

  async function shot(page: Page, name: string, viewport = DESKTOP): Promise<void> {
    await page.setViewportSize(viewport);
    // Let the resized layout paint (SVG charts came out blank when shot in the same frame).
    await page.evaluate(() => new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve))));
    await page.screenshot({ path: join(ARTIFACTS, `demo-${name}.png`), fullPage: true });
  }

  async function send(page: Page, text: string): Promise<void> {
    await page.fill('#chat-input', text);
    await page.press('#chat-input', 'Enter');
  }

  async function lastAgentStatus(page: Page, status: string, timeout = 20_000): Promise<void> {
    await page.waitForFunction((s) => document.querySelector('.msg-agent:last-of-type')?.getAttribute('data-status') === s, status, { timeout });
  }

  /** The page started its agent with the emergent API (forge, registry, approvals). */
  async function assertEmergent(page: Page): Promise<void> {
    const flag = await page.evaluate(() => window.__crucibleDemo);
    assert.equal(flag?.emergent, true, `the demo page reports no emergent API: ${JSON.stringify(flag)}`);
  }

  test('loads with no console errors, at desktop and phone width', async () => {
    const { page, errors } = await open();
    assert.equal(await page.getAttribute('body', 'data-state'), 'idle');
    const hostTools = await page.$$eval('#host-tools code', (els) => els.map((e) => e.textContent));
    for (const name of ['get_weather', 'current_time', 'word_count', 'save_note']) assert.ok(hostTools.includes(name), `host tool ${name} listed`);
    assert.match((await page.textContent('#provider-summary')) ?? '', /127\.0\.0\.1/);
    // Every form control has a label.
    const unlabeled = await page.$$eval('input, select, textarea', (els) =>
      els.filter((el) => !(el as HTMLInputElement).labels?.length && !el.getAttribute('aria-label')).map((el) => el.id || el.outerHTML.slice(0, 60)),
    );
    assert.deepEqual(unlabeled, []);
    await page.click('#settings-details > summary');
    await shot(page, 'load-desktop');
    await shot(page, 'load-phone', PHONE);
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflow <= 0, `no horizontal scrolling at 375 px (overflow ${overflow}px)`);
    assert.deepEqual(await accessibilityViolations(page), [], 'axe-core: WCAG 2 A/AA (contrast, labels, names, roles)');
    // Keyboard: the prompt is reachable with Tab and Enter sends.
    await page.setViewportSize(DESKTOP);
    await page.keyboard.press('Tab');
    let hops = 0;
    while (!(await page.evaluate(() => document.activeElement?.id === 'chat-input')) && hops++ < 40) await page.keyboard.press('Tab');
    assert.ok(hops < 40, 'the prompt is reachable by keyboard');
    assert.deepEqual(errors, []);
  });

  /** WCAG 2 A/AA violations axe-core finds on the page as it is now (ids and first targets). */
  async function accessibilityViolations(page: Page): Promise<string[]> {
    await page.addScriptTag({ path: createRequire(import.meta.url).resolve('axe-core/axe.min.js') });
    const found = await page.evaluate(async () => {
      const axe = (window as unknown as { axe: { run(ctx: Document, opts: unknown): Promise<{ violations: { id: string; nodes: { target: string[] }[] }[] }> } }).axe;
      const result = await axe.run(document, { runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa'] } });
      return result.violations.map((v) => `${v.id}: ${v.nodes.slice(0, 3).map((n) => n.target.join(' ')).join(', ')}`);
    });
    return found;
  }

  test('a chat run streams its answer and shows the tool events', async () => {
    mock.reset();
    const { page, errors } = await open();
    await send(page, 'What is the weather in Oslo?');
    await page.waitForSelector('.msg-agent .tool-call code:text("get_weather")', { timeout: 20_000 });
    await page.waitForSelector('.msg-agent .tool-result', { timeout: 20_000 });
    // Streaming: the answer grows while the run is still going.
    await page.waitForFunction(() => (document.querySelector('.msg-agent:last-of-type .msg-text')?.textContent ?? '').length > 0, undefined, { timeout: 20_000 });
    const partial = await page.textContent('.msg-agent:last-of-type .msg-text');
    const stateWhileStreaming = await page.getAttribute('body', 'data-state');
    // The live log is busy while the answer streams, so screen readers do not read each chunk.
    const busyWhileStreaming = await page.getAttribute('#transcript', 'aria-busy');
    await lastAgentStatus(page, 'done');
    const final = (await page.textContent('.msg-agent:last-of-type .msg-text')) ?? '';
    assert.equal(final, 'It is 4 °C and overcast in Oslo right now, according to the demo weather tool.');
    assert.equal(stateWhileStreaming, 'running');
    assert.equal(busyWhileStreaming, 'true');
    assert.ok(partial!.length < final.length, `saw a partial answer (${JSON.stringify(partial)})`);
    assert.match((await page.textContent('.msg-agent .tool-result')) ?? '', /"celsius":4/);
    assert.equal(await page.getAttribute('body', 'data-state'), 'idle');
    assert.equal(await page.getAttribute('#transcript', 'aria-busy'), 'false');
    assert.equal(await page.isEnabled('#send-button'), true);
    // The page sent the request to the configured provider only, with the host tools offered.
    assert.deepEqual(mock.requests[0]!.toolNames.filter((n) => n !== 'forge_tool').sort(), ['current_time', 'get_weather', 'save_note', 'word_count']);
    await shot(page, 'chat-desktop');
    await shot(page, 'chat-phone', PHONE);
    assert.deepEqual(errors, []);
  });

  test('stop aborts a run mid-way and the page returns to idle', async () => {
    mock.reset();
    const { page, errors } = await open();
    await send(page, 'Please hang for a minute');
    await page.waitForFunction(() => (document.querySelector('.msg-agent:last-of-type .msg-text')?.textContent ?? '').startsWith('Let'), undefined, { timeout: 20_000 });
    assert.equal(await page.getAttribute('body', 'data-state'), 'running');
    assert.equal(await page.isEnabled('#stop-button'), true);
    await shot(page, 'abort-running');
    const started = Date.now();
    await page.click('#stop-button');
    await lastAgentStatus(page, 'stopped', 5000);
    await page.waitForFunction(() => document.body.dataset.state === 'idle', undefined, { timeout: 5000 });
    assert.ok(Date.now() - started < 5000, 'stopped promptly');
    assert.match((await page.textContent('.msg-agent:last-of-type')) ?? '', /Stopped\./);
    assert.equal(await page.isEnabled('#send-button'), true);
    assert.equal(await page.isEnabled('#stop-button'), false);
    await shot(page, 'abort-stopped');
    // The page is usable again: the next run completes.
    await send(page, 'hello again');
    await lastAgentStatus(page, 'done');
    assert.deepEqual(errors, []);
  });

  test('a run that ends while the person types elsewhere leaves the focus where they type', async () => {
    mock.reset();
    const { page, errors } = await open();
    mock.enqueue({ text: 'A slow answer.', delayMs: 2000 });
    await send(page, 'Take your time');
    // Meanwhile the person pastes a package into the import box.
    await page.click('#import-text');
    await page.keyboard.type('format: ');
    await lastAgentStatus(page, 'done');
    await page.keyboard.type('crucible.tool.v1');
    assert.equal(await page.inputValue('#import-text'), 'format: crucible.tool.v1');
    assert.equal(await page.inputValue('#chat-input'), '', 'nothing typed into the chat');
    // Sent from the chat, the prompt gets the focus back for the next message.
    await send(page, 'hello');
    await lastAgentStatus(page, 'done');
    assert.equal(await page.evaluate(() => document.activeElement?.id), 'chat-input');
    assert.deepEqual(errors, []);
  });

  test('settings persist; the API key only on opt-in, and only to its provider', async () => {
    mock.reset();
    const { page, errors, origins } = await open();
    const stored = () => page.evaluate(() => localStorage.getItem('crucible-demo.settings.v1') ?? '');
    await page.click('#settings-details > summary');
    await page.fill('#api-key', 'sk-demo-not-remembered');
    await page.click('#settings-form button[type="submit"]');
    await page.waitForFunction(() => window.__crucibleDemo?.ready === true && document.body.dataset.state === 'idle');
    assert.match(await stored(), new RegExp(mock.openaiBaseURL.replace(/[.:/]/g, '\\$&')));
    assert.doesNotMatch(await stored(), /sk-demo/);
    await send(page, 'hi');
    await lastAgentStatus(page, 'done');
    assert.equal(mock.requests.at(-1)!.headers.authorization, 'Bearer sk-demo-not-remembered');
    await page.check('#remember-key');
    await page.click('#settings-form button[type="submit"]');
    assert.match(await stored(), /sk-demo-not-remembered/);
    await page.uncheck('#remember-key');
    assert.doesNotMatch(await stored(), /sk-demo/);
    // Without the query parameters, a reload starts from what was stored.
    await page.goto(pageURL);
    await waitReady(page);
    assert.match((await page.textContent('#provider-summary')) ?? '', /mock · 127\.0\.0\.1/);
    assert.equal(await page.inputValue('#api-key'), '');
    // The page talks to itself and to the configured provider, nothing else.
    assert.deepEqual([...origins].sort(), [new URL(pageURL).origin, mock.url].sort());
    assert.deepEqual(errors, []);
  });

  test('unticking "Remember the key" forgets the stored key and saves nothing that was not applied', async () => {
    mock.reset();
    const { page, errors } = await open();
    const stored = () => page.evaluate(() => JSON.parse(localStorage.getItem('crucible-demo.settings.v1') ?? 'null'));
    await page.click('#settings-details > summary');
    await page.fill('#api-key', 'sk-demo-remembered');
    await page.check('#remember-key');
    await page.click('#settings-form button[type="submit"]');
    await page.waitForFunction(() => window.__crucibleDemo?.ready === true && document.body.dataset.state === 'idle');
    assert.equal((await stored()).kind, 'openai');
    // Another provider chosen in the form but not applied, then the key forgotten.
    await page.check('#provider-ollama');
    await page.uncheck('#remember-key');
    const after = await stored();
    assert.equal(after.kind, 'openai', 'the unapplied provider is not saved');
    assert.equal(after.rememberKey, false);
    assert.doesNotMatch(JSON.stringify(after), /sk-demo/);
    await page.goto(pageURL);
    await waitReady(page);
    assert.match((await page.textContent('#provider-summary')) ?? '', /^OpenAI-compatible · mock · 127\.0\.0\.1/);
    assert.deepEqual(errors, []);
  });

  test('ticking "Remember the key" after the key was applied remembers it, as unticking forgets at once', async () => {
    mock.reset();
    const { page, errors } = await open();
    await page.click('#settings-details > summary');
    await page.fill('#api-key', 'sk-applied-then-remembered');
    await page.click('#settings-form button[type="submit"]');
    await page.waitForFunction(() => document.body.dataset.ready === 'true' && document.body.dataset.state === 'idle');
    await page.check('#remember-key');
    assert.match((await page.textContent('#settings-status')) ?? '', /remembered in this browser/);
    await page.goto(`${pageURL}?${new URLSearchParams({ baseURL: mock.openaiBaseURL, model: 'mock' })}`);
    await waitReady(page);
    assert.equal(await page.inputValue('#api-key'), 'sk-applied-then-remembered');
    assert.equal(await page.isChecked('#remember-key'), true);
    assert.deepEqual(errors, []);
  });

  test('a remembered key is not sent to a base URL given by a link', async () => {
    mock.reset();
    const other = await startMockLlmServer({ respond: scriptedModel });
    try {
      const { page, errors } = await open();
      const secret = 'sk-remembered-for-mock';
      await page.click('#settings-details > summary');
      await page.fill('#api-key', secret);
      await page.check('#remember-key');
      await page.click('#settings-form button[type="submit"]');
      await page.waitForFunction(() => document.body.dataset.ready === 'true' && document.body.dataset.state === 'idle');
      await send(page, 'hi');
      await lastAgentStatus(page, 'done');
      assert.equal(mock.requests.at(-1)!.headers.authorization, `Bearer ${secret}`);
      // A link to another server (with or without a provider): no remembered key, nothing sent with it.
      const links: Record<string, string>[] = [{ baseURL: other.openaiBaseURL, model: 'mock' }, { provider: 'openai', baseURL: other.openaiBaseURL, model: 'mock' }];
      const filled: string[] = [];
      for (const query of links) {
        await page.goto(`${pageURL}?${new URLSearchParams(query)}`);
        await waitReady(page);
        filled.push(await page.inputValue('#api-key'));
        await send(page, 'hello other server');
        await lastAgentStatus(page, 'done');
      }
      assert.ok(other.requests.length >= 2, 'the page talked to the other server');
      for (const r of other.requests) assert.ok(!String(r.headers.authorization ?? '').includes(secret), `key sent to the other server: ${r.headers.authorization}`);
      assert.deepEqual(filled, ['', ''], 'the key field stays empty for the other server');
      // Back on the server it was remembered for, the key is used again.
      await page.goto(`${pageURL}?${new URLSearchParams({ baseURL: mock.openaiBaseURL, model: 'mock' })}`);
      await waitReady(page);
      assert.equal(await page.inputValue('#api-key'), secret);
      // Typing another base URL into the form takes the key away, typing the old one brings it back.
      await page.click('#settings-details > summary');
      await page.fill('#base-url', other.openaiBaseURL);
      assert.equal(await page.inputValue('#api-key'), '');
      await page.fill('#base-url', mock.openaiBaseURL);
      assert.equal(await page.inputValue('#api-key'), secret);
      assert.deepEqual(errors, []);
    } finally {
      await other.close();
    }
  });

  test('a key typed and applied before the page\'s script has loaded does not land in the address bar', async () => {
    const context = await browser.newContext({ viewport: DESKTOP });
    contexts.push(context);
    const page = await context.newPage();
    // A slow connection: the form shows while the script is still on its way.
    let release = () => {};
    const loaded = new Promise<void>((resolve) => (release = resolve));
    await page.route('**/assets/index-*.js', async (route) => {
      await loaded;
      await route.continue();
    });
    await page.goto(pageURL, { waitUntil: 'commit' });
    await page.click('#settings-details > summary');
    await page.fill('#base-url', mock.openaiBaseURL);
    await page.fill('#model-name', 'mock');
    await page.fill('#api-key', 'sk-typed-early');
    await page.click('#settings-form button[type="submit"]');
    await page.waitForTimeout(500);
    release();
    await waitReady(page);
    assert.doesNotMatch(page.url(), /sk-typed-early/);
  });

  test('the settings disclosure shows its marker; a base URL the browser refuses clears the older status line', async () => {
    const { page, errors } = await open();
    // A flex summary loses the disclosure triangle.
    assert.equal(await page.evaluate(() => getComputedStyle(document.querySelector('#settings-details > summary')!).display), 'list-item');
    await page.click('#settings-details > summary');
    await page.fill('#base-url', 'localhost:8089');
    await page.click('#settings-form button[type="submit"]');
    assert.match((await page.textContent('#settings-status')) ?? '', /got "localhost:8089"/);
    // Refused by the browser (no submit event at all): the line about localhost:8089 goes.
    await page.fill('#base-url', 'not a url');
    await page.click('#settings-form button[type="submit"]');
    assert.equal(await page.evaluate(() => document.querySelector<HTMLInputElement>('#base-url')!.validity.valid), false);
    assert.equal(await page.textContent('#settings-status'), '');
    assert.deepEqual(errors, []);
  });

  test('without a usable IndexedDB the agent starts in memory, and the page says nothing is kept after a reload', async () => {
    const cases: Array<[string, () => void]> = [
      ['no IndexedDB', () => Object.defineProperty(window, 'indexedDB', { value: undefined, configurable: true })],
      // As some private windows do: every open fails.
      [
        'IndexedDB refused',
        () => {
          IDBFactory.prototype.open = function () {
            const request = {
              error: new DOMException('A mutation operation was attempted on a database that did not allow mutations.', 'InvalidStateError'),
              result: undefined,
              onerror: null as ((event: unknown) => void) | null,
              onsuccess: null,
              onupgradeneeded: null,
              onblocked: null,
              addEventListener(type: string, listener: unknown) {
                (this as unknown as Record<string, unknown>)[`on${type}`] = listener;
              },
            };
            setTimeout(() => request.onerror?.({ target: request }), 10);
            return request as unknown as IDBOpenDBRequest;
          };
        },
      ],
    ];
    for (const [what, init] of cases) {
      const context = await browser.newContext({ viewport: DESKTOP });
      contexts.push(context);
      await context.addInitScript(init);
      // open() fails when the agent does not start.
      const { page, errors } = await open({}, DESKTOP, context);
      assert.equal(await page.isVisible('#storage-note'), true, what);
      assert.match((await page.textContent('#storage-note')) ?? '', /^Nothing is kept after a reload: this browser .*IndexedDB.*promoted tools.*pending approvals last only until this page is reloaded/, what);
      assert.match((await page.textContent('#registry-keep')) ?? '', /promoted ones until this page is reloaded/, what);
      await send(page, 'hello');
      await lastAgentStatus(page, 'done');
      assert.deepEqual(errors, [], what);
    }
  });

  test('two quick applies leave the page ready with an agent', async () => {
    mock.reset();
    const { page, errors } = await open();
    await page.evaluate(() => {
      const form = document.querySelector<HTMLFormElement>('#settings-form')!;
      form.requestSubmit();
      form.requestSubmit();
    });
    await page.waitForFunction(() => document.body.dataset.ready === 'true' && document.body.dataset.state !== 'loading', undefined, { timeout: 30_000 });
    const flag = await page.evaluate(() => window.__crucibleDemo!);
    assert.equal(flag.error, undefined, `the agent did not start: ${flag.error}`);
    assert.equal(await page.getAttribute('body', 'data-state'), 'idle');
    await send(page, 'still here?');
    await lastAgentStatus(page, 'done');
    assert.equal(await page.textContent('.msg-agent:last-of-type .msg-text'), 'echo: still here?');
    assert.deepEqual(errors, []);
  });

  test('a tool call that needs approval pauses the run; approving resumes it', async () => {
    mock.reset();
    const { page, errors } = await open();
    await send(page, 'Save a note: buy milk');
    await lastAgentStatus(page, 'paused');
    await page.waitForSelector('#approvals [data-tool="save_note"] [data-action="approve"]', { timeout: 10_000 });
    assert.equal(await page.getAttribute('body', 'data-state'), 'idle');
    assert.match((await page.textContent('#approvals [data-tool="save_note"]')) ?? '', /buy milk/);
    await shot(page, 'toolcall-pending');
    await shot(page, 'toolcall-pending-phone', PHONE);
    await page.setViewportSize(DESKTOP);
    await page.click('#approvals [data-tool="save_note"] [data-action="approve"]');
    await lastAgentStatus(page, 'done');
    assert.equal(await page.textContent('.msg-agent:last-of-type .msg-text'), 'Saved your note.');
    assert.equal(await page.$$eval('#approvals [data-approval]', (els) => els.length), 0);
    assert.equal(await page.evaluate(() => localStorage.getItem('crucible-demo.notes.v1')), '["buy milk"]');
    await page.waitForFunction(() => /^Approved: save_note/.test(document.querySelector('#approvals .hint')?.textContent ?? ''), undefined, { timeout: 5000 });
    // Denied calls reach the model as a refusal; nothing is saved.
    await send(page, 'Another note please');
    await lastAgentStatus(page, 'paused');
    // The new request is not shown under the line about the one decided before.
    await page.waitForSelector('#approvals [data-tool="save_note"] [data-action="deny"]', { timeout: 10_000 });
    assert.deepEqual(await page.$$eval('#approvals .hint', (els) => els.map((el) => el.textContent)), []);
    await page.fill('#approvals [data-tool="save_note"] .deny-reason', 'not today');
    await page.click('#approvals [data-tool="save_note"] [data-action="deny"]');
    await lastAgentStatus(page, 'done');
    assert.match((await page.textContent('.msg-agent:last-of-type .msg-text')) ?? '', /^Not saved/);
    assert.equal(await page.evaluate(() => localStorage.getItem('crucible-demo.notes.v1')), '["buy milk"]');
    await shot(page, 'toolcall-done');
    assert.deepEqual(errors, []);
  });

  test('a deny reason typed for one call survives the decision on another, and reaches the model', async () => {
    mock.reset();
    const { page, errors } = await open();
    await send(page, 'Save notes A and B');
    await lastAgentStatus(page, 'paused');
    await page.waitForFunction(() => document.querySelectorAll('#approvals [data-approval]').length === 2, undefined, { timeout: 10_000 });
    const cardA = page.locator('#approvals [data-approval]', { hasText: 'note A' });
    const cardB = page.locator('#approvals [data-approval]', { hasText: 'note B' });
    await cardB.locator('.deny-reason').fill('note B is private');
    // Approving A leaves the run waiting on B; the cards are drawn again meanwhile.
    await cardA.locator('[data-action="approve"]').click();
    await page.waitForFunction(() => /decide the run's other calls/.test(document.querySelector('#approvals')?.textContent ?? ''), undefined, { timeout: 10_000 });
    assert.equal(await cardB.locator('.deny-reason').inputValue(), 'note B is private');
    await cardB.locator('[data-action="deny"]').click();
    await lastAgentStatus(page, 'done');
    const toolResults = mock.requests.flatMap((r) => r.messages.filter((m) => m.role === 'tool').map((m) => m.content ?? ''));
    assert.ok(toolResults.some((c) => c.includes('note B is private')), `the model got the typed reason: ${JSON.stringify(toolResults)}`);
    assert.ok(!toolResults.some((c) => c.includes('denied in the demo page')), 'not the generic reason');
    assert.equal(await page.evaluate(() => localStorage.getItem('crucible-demo.notes.v1')), '["note A"]');
    assert.deepEqual(errors, []);
  });

  test('a resumed run that pauses again keeps its new approval, also after a reload', async () => {
    mock.reset();
    const { page, errors } = await open();
    const stored = () => page.evaluate(() => localStorage.getItem('crucible-demo.paused.v1') ?? '');
    await send(page, 'Save two notes: buy milk, then buy bread');
    await lastAgentStatus(page, 'paused');
    await page.click('#approvals [data-tool="save_note"] [data-action="approve"]');
    // The resumed run (same run id) saved the first note and waits on the second call.
    await page.waitForFunction(() => /buy bread/.test(document.querySelector('#approvals [data-tool="save_note"]')?.textContent ?? ''), undefined, { timeout: 20_000 });
    await lastAgentStatus(page, 'paused');
    assert.equal(await page.$$eval('#approvals [data-approval]', (els) => els.length), 1);
    assert.match(await stored(), /buy bread/);
    assert.doesNotMatch(await stored(), /buy milk/);
    await page.reload();
    await waitReady(page);
    await page.waitForSelector('#approvals [data-tool="save_note"] [data-action="approve"]', { timeout: 10_000 });
    assert.match((await page.textContent('#approvals [data-tool="save_note"]')) ?? '', /buy bread/);
    // It still resumes the run to its end.
    await page.click('#approvals [data-tool="save_note"] [data-action="approve"]');
    await lastAgentStatus(page, 'done');
    assert.equal(await page.textContent('.msg-agent:last-of-type .msg-text'), 'Saved your note.');
    assert.equal(await page.$$eval('#approvals [data-approval]', (els) => els.length), 0);
    assert.equal(await stored(), '');
    assert.equal(await page.evaluate(() => localStorage.getItem('crucible-demo.notes.v1')), '["buy milk","buy bread"]');
    assert.deepEqual(errors, []);
  });

  test('a failed resume keeps the approval and shows the error; approving again finishes the run', async () => {
    mock.reset();
    const { page, errors } = await open();
    await send(page, 'Save a note: buy milk');
    await lastAgentStatus(page, 'paused');
    // The model fails on the call after the approved tool ran (400: not retried).
    mock.enqueue({ status: 400 });
    await page.click('#approvals [data-tool="save_note"] [data-action="approve"]');
    await lastAgentStatus(page, 'error');
    await page.waitForSelector('#approvals .hint', { timeout: 10_000 });
    assert.match((await page.textContent('#approvals .hint')) ?? '', /^Could not approve: /);
    // The call ran: it is not offered for a decision again, but as a run to continue.
    await page.waitForSelector('#approvals [data-continue] [data-action="continue"]', { timeout: 10_000 });
    assert.equal(await page.$$eval('#approvals [data-approval]', (els) => els.length), 0);
    assert.match(await page.evaluate(() => localStorage.getItem('crucible-demo.paused.v1') ?? ''), /buy milk/);
    await page.click('#approvals [data-continue] [data-action="continue"]');
    await lastAgentStatus(page, 'done');
    assert.equal(await page.textContent('.msg-agent:last-of-type .msg-text'), 'Saved your note.');
    assert.equal(await page.$$eval('#approvals [data-approval], #approvals [data-continue]', (els) => els.length), 0);
    // The approved call ran once.
    assert.equal(await page.evaluate(() => localStorage.getItem('crucible-demo.notes.v1')), '["buy milk"]');
    assert.deepEqual(errors.filter((e) => !/status of 400/.test(e)), []);
  });

  test('a decided call is not offered again after a reload while its run goes on: the run is continued, the call runs once', async () => {
    mock.reset();
    const { page, errors } = await open();
    await send(page, 'Save a note: buy milk');
    await lastAgentStatus(page, 'paused');
    // The model call after the approved tool hangs: the page is reloaded while the run waits for it.
    mock.enqueue({ delayMs: 20_000, text: 'too late' });
    // A double click sends one decision (the second click used to fail: "a run is in progress").
    await page.dblclick('#approvals [data-tool="save_note"] [data-action="approve"]');
    await page.waitForFunction(() => localStorage.getItem('crucible-demo.notes.v1') === '["buy milk"]', undefined, { timeout: 10_000 });
    await page.waitForTimeout(300);
    assert.doesNotMatch((await page.textContent('#approvals')) ?? '', /in progress/);
    assert.equal(await page.$$eval('#approvals [data-action="approve"]', (els) => els.length), 0, 'no live Approve while the run goes on');
    await page.reload();
    await waitReady(page);
    await page.waitForSelector('#approvals [data-continue] [data-action="continue"]', { timeout: 10_000 });
    assert.equal(await page.$$eval('#approvals [data-action="approve"], #approvals [data-action="deny"]', (els) => els.length), 0, 'the used approval is not offered again');
    assert.match((await page.textContent('#approvals [data-continue]')) ?? '', /save_note approved/);
    await page.click('#approvals [data-continue] [data-action="continue"]');
    await lastAgentStatus(page, 'done');
    assert.equal(await page.textContent('.msg-agent:last-of-type .msg-text'), 'Saved your note.');
    assert.equal(await page.$$eval('#approvals [data-approval], #approvals [data-continue]', (els) => els.length), 0);
    assert.equal(await page.evaluate(() => localStorage.getItem('crucible-demo.paused.v1')), null);
    assert.equal(await page.evaluate(() => localStorage.getItem('crucible-demo.notes.v1')), '["buy milk"]');
    assert.deepEqual(errors, []);
  });

  test('a run cut off by a reload mid-stream leaves no stored state behind', async () => {
    mock.reset();
    const { page, errors } = await open();
    await send(page, 'Please hang for a minute');
    await page.waitForFunction(() => (document.querySelector('.msg-agent:last-of-type .msg-text')?.textContent ?? '').startsWith('Let'), undefined, { timeout: 20_000 });
    await page.reload();
    await waitReady(page);
    // Startup discards the stored runs no pending approval refers to (the page cannot resume them).
    await assertNoStoredRuns(page);
    assert.deepEqual(errors, []);
  });

  test('Escape stops a run from the chat, not from other fields', async () => {
    mock.reset();
    const { page, errors } = await open();
    await send(page, 'Please hang for a minute');
    await page.waitForFunction(() => (document.querySelector('.msg-agent:last-of-type .msg-text')?.textContent ?? '').startsWith('Let'), undefined, { timeout: 20_000 });
    await page.press('#import-text', 'Escape');
    await page.waitForTimeout(300);
    assert.equal(await page.getAttribute('body', 'data-state'), 'running', 'Escape in another field leaves the run going');
    await page.press('#chat-input', 'Escape');
    await lastAgentStatus(page, 'stopped', 5000);
    assert.deepEqual(errors, []);
  });

  test('a promotionUses that is not a whole number is refused in plain words', async () => {
    const context = await browser.newContext({ viewport: DESKTOP });
    contexts.push(context);
    const page = await context.newPage();
    await page.goto(`${pageURL}?${new URLSearchParams({ baseURL: mock.openaiBaseURL, model: 'mock', promotionUses: 'abc' })}`);
    await page.waitForFunction(() => window.__crucibleDemo?.ready === true, undefined, { timeout: 30_000 });
    const error = (await page.evaluate(() => window.__crucibleDemo?.error)) ?? '';
    assert.match(error, /promotionUses= must be a whole number.*“abc”/, error);
    assert.match((await page.textContent('#settings-status')) ?? '', /whole number/);
  });

  test('an approval whose run is gone is dismissed with the reason instead of being offered forever', async () => {
    mock.reset();
    const { page, errors } = await open();
    // A paused run this store does not hold (its state was cleared, or another tab resumed it).
    await page.evaluate(() =>
      localStorage.setItem(
        'crucible-demo.paused.v1',
        JSON.stringify([{ id: 'approval_gone', kind: 'tool_call', tool: 'save_note', runId: 'run_gone', callId: 'c1', arguments: { text: 'lost' }, reason: 'needs approval', requestedAt: Date.now() }]),
      ),
    );
    await page.reload();
    await waitReady(page);
    await page.waitForSelector('#approvals [data-tool="save_note"] [data-action="approve"]', { timeout: 10_000 });
    await page.click('#approvals [data-tool="save_note"] [data-action="approve"]');
    await page.waitForSelector('#approvals .hint', { timeout: 10_000 });
    const hint = (await page.textContent('#approvals .hint')) ?? '';
    assert.match(hint, /^Could not approve: .*run_gone.*dismissed/, hint);
    assert.equal(await page.$$eval('#approvals [data-approval]', (els) => els.length), 0);
    assert.equal(await page.evaluate(() => localStorage.getItem('crucible-demo.paused.v1')), null);
    assert.deepEqual(errors, []);
  });

  test('a second tab waits while the first holds the agent, and takes over once it closes', async () => {
    const context = await browser.newContext({ viewport: DESKTOP });
    contexts.push(context);
    const first = await open({}, DESKTOP, context);
    const second = await context.newPage();
    await second.goto(`${pageURL}?${new URLSearchParams({ baseURL: mock.openaiBaseURL, model: 'mock' })}`);
    await second.waitForFunction(() => /another tab/.test(window.__crucibleDemo?.error ?? ''), null, { timeout: 20_000 });
    // The reason is in view (not inside closed settings), in sentences a person can act on
    // (not the package's advice to give the agent another agentId, which the page chooses).
    const notice = (await second.textContent('#settings-status')) ?? '';
    assert.match(notice, /^Another tab of this page holds the agent.*close that tab.*takes over/i, notice);
    assert.doesNotMatch(notice, /agentId/);
    assert.equal(await second.isVisible('#settings-status'), true, 'the blocked notice is visible');
    // While it waits it says nothing new: its retries do not flash "loading…" nor write the
    // notice again (both are read out by a screen reader, here every two seconds).
    await second.evaluate(() => {
      const changes: string[] = ((window as unknown as { __changes: string[] }).__changes = []);
      for (const id of ['run-state', 'settings-status']) {
        const el = document.getElementById(id)!;
        new MutationObserver(() => changes.push(`${id}: ${el.textContent}`)).observe(el, { childList: true, characterData: true, subtree: true });
      }
    });
    await second.waitForTimeout(4500);
    assert.deepEqual(await second.evaluate(() => (window as unknown as { __changes: string[] }).__changes), []);
    assert.equal(await second.textContent('#run-state'), 'not ready');
    await first.page.close();
    await second.waitForFunction(() => window.__crucibleDemo?.ready === true && window.__crucibleDemo.error === undefined && window.__crucibleDemo.emergent, null, { timeout: 20_000 });
    assert.equal(await second.textContent('#settings-status'), '', 'the blocked notice goes once the agent started');
  });

  test('a tab waiting for another shows the chat and the import unavailable and says why; its registry does not claim to be empty', async () => {
    const context = await browser.newContext({ viewport: DESKTOP });
    contexts.push(context);
    const first = await open({}, DESKTOP, context);
    const second = await context.newPage();
    const errors: string[] = [];
    second.on('pageerror', (error) => errors.push(error.message));
    await second.goto(`${pageURL}?${new URLSearchParams({ baseURL: mock.openaiBaseURL, model: 'mock' })}`);
    await second.waitForFunction(() => /another tab/.test(window.__crucibleDemo?.error ?? ''), null, { timeout: 20_000 });
    const chat = () => second.evaluate(() => ({ input: document.querySelector('#chat-input')!.getAttribute('aria-disabled'), status: document.querySelector('#chat-status')!.textContent }));
    assert.deepEqual(await chat(), { input: 'true', status: 'Another tab of this page holds the agent: this tab takes over once that one closes.' });
    // Shown disabled, not `disabled`: the focus stays, what is typed stays, and Enter says why.
    await second.focus('#chat-input');
    await second.keyboard.type('hello from the second tab');
    await second.keyboard.press('Enter');
    assert.match((await second.textContent('#chat-status')) ?? '', /^Not sent: Another tab/);
    assert.equal(await second.inputValue('#chat-input'), 'hello from the second tab');
    assert.equal(await second.evaluate(() => document.activeElement?.id), 'chat-input');
    assert.equal(await second.$$eval('#transcript .msg-user', (els) => els.length), 0);
    assert.equal(await second.getAttribute('#import-button', 'aria-disabled'), 'true');
    assert.equal(await second.getAttribute('#import-text', 'aria-disabled'), 'true');
    await second.focus('#import-text');
    await second.keyboard.type('format: crucible.tool.v1');
    await second.focus('#import-button');
    await second.keyboard.press('Enter');
    assert.match((await second.textContent('#import-status')) ?? '', /^Not imported: the registry opens once this tab holds the agent/);
    assert.equal(await second.evaluate(() => document.activeElement?.id), 'import-button');
    // The other tab's tools are not known here: no "No forged tools yet".
    assert.equal(await second.textContent('#registry-empty'), 'The registry shows once this tab holds the agent.');
    await first.page.close();
    await second.waitForFunction(() => window.__crucibleDemo?.ready === true && window.__crucibleDemo.error === undefined, null, { timeout: 20_000 });
    assert.deepEqual(await chat(), { input: null, status: '' });
    assert.equal(await second.getAttribute('#import-button', 'aria-disabled'), null);
    assert.equal(await second.getAttribute('#import-text', 'aria-disabled'), null);
    await second.waitForFunction(() => document.querySelector('#registry-empty')?.textContent === 'No forged tools yet.', null, { timeout: 5000 });
    await send(second, 'hello again');
    await lastAgentStatus(second, 'done');
    assert.deepEqual(errors, []);
  });

  /** Waits up to 5 s for the page's IndexedDB to hold no run state, then asserts it holds none. */
  async function assertNoStoredRuns(page: Page): Promise<void> {
    const until = Date.now() + 5_000;
    while ((await storedRuns(page)) > 0 && Date.now() < until) await new Promise((resolve) => setTimeout(resolve, 100));
    assert.equal(await storedRuns(page), 0);
  }

  /** How many runs the page's IndexedDB holds the state of. */
  async function storedRuns(page: Page): Promise<number> {
    return page.evaluate(
      (name) =>
        new Promise<number>((resolve, reject) => {
          const open = indexedDB.open(name);
          open.onerror = () => reject(open.error);
          open.onsuccess = () => {
            const keys = open.result.transaction('kv').objectStore('kv').getAllKeys();
            keys.onsuccess = () => resolve(keys.result.filter((k) => String(k).includes('/run/')).length);
          };
        }),
      'crucible-demo',
    );
  }

  test('a model server that cannot be reached is said in plain words, with the raw error under Details', async () => {
    const { page } = await open({ provider: 'local', baseURL: 'http://127.0.0.1:9/v1' });
    // Said at start, before a message fails on it.
    await page.waitForFunction(() => /does not answer: start it with `bash scripts\/model\/start\.sh`/.test(document.querySelector('#transcript .msg-notice')?.textContent ?? ''), undefined, { timeout: 10_000 });
    await send(page, 'hello?');
    await lastAgentStatus(page, 'error');
    const note = (await page.textContent('.msg-agent:last-of-type .run-note')) ?? '';
    // The local model (the page's default provider): how to start it.
    assert.match(note, /Could not reach the local model server: start it with `bash scripts\/model\/start\.sh`/, note);
    assert.match((await page.textContent('.msg-agent:last-of-type .run-detail summary')) ?? '', /provider_network/);
    // The page offers no resume for a failed run, so it keeps no state of it in IndexedDB.
    await assertNoStoredRuns(page);
    // Another provider's server: whether it runs and takes requests from the page.
    const other = await open({ provider: 'openai', baseURL: 'http://127.0.0.1:9/v1' });
    await send(other.page, 'hello?');
    await lastAgentStatus(other.page, 'error');
    assert.match((await other.page.textContent('.msg-agent:last-of-type .run-note')) ?? '', /Could not reach the model server: is it running/);
  });

  test('a server error, a web page instead of the API and a stream cut off mid-answer are said in plain words, the raw text only under Details', async () => {
    let mode: 'error' | 'page' | 'cut' = 'error';
    const server = await startRawServer((res) => {
      if (mode === 'error') return void res.writeHead(500, { 'content-type': 'application/json' }).end(JSON.stringify({ error: { message: 'internal boom' } }));
      if (mode === 'page') return void res.writeHead(200, { 'content-type': 'text/html' }).end('<!doctype html><html><body>Welcome to the router</body></html>');
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      for (const content of ['Once ', 'upon ', 'a time ']) res.write(`data: ${JSON.stringify({ id: 'x', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content }, finish_reason: null }] })}\n\n`);
      setTimeout(() => res.socket?.destroy(), 100);
    });
    try {
      const { page } = await open({ baseURL: server.baseURL });
      const failure = async (text: string) => {
        await send(page, text);
        await lastAgentStatus(page, 'error');
        return {
          note: (await page.textContent('.msg-agent:last-of-type .run-note')) ?? '',
          detail: (await page.textContent('.msg-agent:last-of-type .run-detail pre')) ?? '',
        };
      };
      const error = await failure('hello?');
      assert.match(error.note, /^The model server failed on this request \(HTTP 500\): try again, or check the server's logs\.$/, error.note);
      assert.match(error.detail, /HTTP 500: internal boom/);
      mode = 'page';
      const page200 = await failure('hello again?');
      assert.match(page200.note, /^The base URL answers, but not as an OpenAI-compatible API \(it sent a web page\): check the base URL\.$/, page200.note);
      assert.match(page200.detail, /text\/html.*Welcome to the router/);
      mode = 'cut';
      const cut = await failure('tell me a story');
      assert.equal(await page.textContent('.msg-agent:last-of-type .msg-text'), 'Once upon a time ');
      assert.match(cut.note, /^The connection to the model server was lost mid-answer/, cut.note);
      assert.match(cut.detail, /provider_network|network error/);
    } finally {
      await server.close();
    }
  });

  test('"Forge an example tool" forges slugify without the model writing a forge_tool call', async () => {
    const { page, errors } = await openEmergent();
    await page.click('#forge-example');
    await page.waitForFunction(() => /Registered slugify v1/.test(document.querySelector('#forge-example-status')?.textContent ?? ''), null, { timeout: 60_000 });
    await page.waitForSelector('.tl-card[data-name="slugify"][data-status="registered"]', { timeout: 10_000 });
    await page.waitForSelector('#registry-list [data-tool="slugify"][data-tier="session"]', { timeout: 10_000 });
    // The registry says what a reload does to a session tool; promotion offers only the agent tier.
    await page.click('#registry-list [data-tool="slugify"]');
    assert.deepEqual(await page.$$eval('#promote-tier option', (els) => els.map((e) => (e as HTMLOptionElement).value)), ['agent']);
    assert.deepEqual(errors, []);
  });

  test('forging the same example twice shows two cards (equal events are not dropped), the second one the tool already there', async () => {
    const { page, errors } = await openEmergent();
    await page.click('#forge-example');
    await page.waitForFunction(() => /Registered slugify v1/.test(document.querySelector('#forge-example-status')?.textContent ?? ''), undefined, { timeout: 60_000 });
    await page.click('#forge-example');
    await page.waitForFunction(() => /slugify v1 \(session tier\) is this very tool already/.test(document.querySelector('#forge-example-status')?.textContent ?? ''), undefined, { timeout: 60_000 });
    await page.waitForFunction(() => document.querySelectorAll('.tl-card[data-name="slugify"][data-status="registered"]').length === 2, undefined, { timeout: 10_000 });
    const outcomes = await page.$$eval('.tl-card[data-name="slugify"] [data-step="registered"]', (els) => els.map((e) => e.textContent ?? ''));
    assert.equal(outcomes.length, 2);
    assert.match(outcomes[0]!, /^Registered session tier, version 1/);
    assert.match(outcomes[1]!, /^Already registered session tier, version 1.*not tested or judged again/);
    assert.equal(await page.$$eval('.tl-card[data-name="slugify"] [data-step="judge"]', (els) => els.length), 1, 'only the first forge asked the judge');
    assert.deepEqual(errors, []);
  });

  test('a refresh keeps what a person is doing: the focus and caret in a deny reason, an open Schemas disclosure, a picked version', async () => {
    const { page, errors } = await openEmergent();
    const item = '#registry-list [data-tool="slugify"]';
    // Two more versions, so the detail offers two to roll back to: v1 first, v2 picked.
    await forgeTwoVersions(page);
    await send(page, 'Make me a slug tool with underscores');
    await page.waitForFunction((sel) => /v3/.test(document.querySelector(sel)?.textContent ?? ''), item, { timeout: 30_000 });
    await lastAgentStatus(page, 'done');
    await page.click(item);
    await page.click('#registry-detail details.schemas summary');
    await page.selectOption('#rollback-version', '2');
    await send(page, 'Save notes A and B');
    await lastAgentStatus(page, 'paused');
    const reasonB = page.locator('#approvals [data-approval]', { hasText: 'note B' }).locator('.deny-reason');
    await reasonB.fill('private');
    await reasonB.press('ArrowLeft');
    await reasonB.press('ArrowLeft');
    // Rebuild every panel without moving the focus: a forge (events, then a refresh).
    const drawn = await page.evaluate(() => {
      const w = window as unknown as { __before: Element[] };
      w.__before = [document.activeElement!, document.querySelector('#registry-detail details.schemas')!];
      document.querySelector<HTMLButtonElement>('#forge-example')!.click();
      return document.activeElement?.className;
    });
    assert.equal(drawn, 'deny-reason');
    await page.waitForFunction(() => /Registered slugify v4/.test(document.querySelector('#forge-example-status')?.textContent ?? ''), undefined, { timeout: 60_000 });
    await page.waitForFunction(() => {
      const before = (window as unknown as { __before: Element[] }).__before;
      return !before[0]!.isConnected && !before[1]!.isConnected;
    }, undefined, { timeout: 10_000 });
    const after = await page.evaluate(() => {
      const active = document.activeElement as HTMLInputElement;
      return {
        focused: active.classList.contains('deny-reason') && active.closest('[data-approval]')?.textContent?.includes('note B'),
        value: active.value,
        caret: active.selectionStart,
        schemasOpen: document.querySelector<HTMLDetailsElement>('#registry-detail details.schemas')?.open,
        rollbackTo: document.querySelector<HTMLSelectElement>('#rollback-version')?.value,
      };
    });
    assert.deepEqual(after, { focused: true, value: 'private', caret: 5, schemasOpen: true, rollbackTo: '2' });
    assert.deepEqual(errors, []);
  });

  test('a double click on Demote demotes one tier, and the page says "done" (not the tool\'s status)', async () => {
    const { page, errors } = await openEmergent({ promotionUses: '0', autoPromote: '0' });
    const item = '#registry-list [data-tool="slugify"]';
    await forgeExample(page);
    // session → agent → shared (approved by the human).
    await page.click(item);
    await page.selectOption('#promote-tier', 'agent');
    await page.click('#registry-detail [data-action="promote"]');
    await page.waitForSelector(`${item}[data-tier="agent"]`, { timeout: 30_000 });
    await page.click(item);
    await page.click('#registry-detail [data-action="promote"]');
    await page.click('#approvals [data-tool="slugify"] [data-action="approve"]');
    await page.waitForSelector(`${item}[data-tier="shared"]`, { timeout: 30_000 });
    await page.click(item);
    await page.dblclick('#registry-detail [data-action="demote"]');
    await page.waitForSelector(`${item}[data-tier="agent"]`, { timeout: 10_000 });
    await page.waitForFunction(() => /^Demote slugify: /.test(document.querySelector('#registry-detail .action-status')?.textContent ?? ''), undefined, { timeout: 10_000 });
    await page.waitForTimeout(1000);
    // The demoted shared entry stays listed (for its audit trail); nothing reached the session tier.
    assert.deepEqual(await page.$$eval(item, (els) => els.map((e) => e.getAttribute('data-tier')).sort()), ['agent', 'shared'], 'one tier down, not two');
    assert.equal(await page.$$eval('#timeline .tl-demoted', (els) => els.length), 1);
    assert.equal(await page.textContent('#registry-detail .action-status'), 'Demote slugify: done.');
    assert.deepEqual(errors, []);
  });

  test('a promotion whose panel does not answer can be stopped; nothing is recorded and it can be asked again', async () => {
    const { page, errors } = await openEmergent({ promotionUses: '0', autoPromote: '0' });
    const item = '#registry-list [data-tool="slugify"]';
    await forgeExample(page);
    // The panel's reviewers (a slow local model, say) take a minute.
    mock.setResponder((request) =>
      request.toolNames.length === 0 && request.messages.some((m) => /reviewer of a promotion panel/.test(m.content ?? '')) ? { text: JSON.stringify(VERDICT), delayMs: 60_000 } : scriptedModel(request),
    );
    try {
      await page.click(item);
      await page.click('#registry-detail [data-action="promote"]');
      await page.waitForSelector('#registry-detail [data-action="stop-action"]', { timeout: 10_000 });
      const started = Date.now();
      await page.click('#registry-detail [data-action="stop-action"]');
      await page.waitForFunction(() => /stopped: nothing was recorded/.test(document.querySelector('#registry-detail .action-status')?.textContent ?? ''), undefined, { timeout: 5000 });
      assert.ok(Date.now() - started < 5000, 'stopped promptly');
      assert.equal(await page.$('#registry-detail [data-action="stop-action"]'), null, 'the Stop button goes with the action');
      assert.equal(await page.getAttribute(`${item}`, 'data-tier'), 'session');
    } finally {
      mock.setResponder(scriptedModel);
    }
    // Stopped is no "no": asked again, the panel answers and the tool moves up.
    await page.click('#registry-detail [data-action="promote"]');
    await page.waitForSelector(`${item}[data-tier="agent"]`, { timeout: 30_000 });
    assert.deepEqual(errors, []);
  });

  test('above the session tier, the rollback picker offers only versions that passed that tier\'s review', async () => {
    const { page, errors } = await openEmergent({ promotionUses: '0', autoPromote: '0' });
    const item = '#registry-list [data-tool="slugify"]';
    await forgeTwoVersions(page);
    await page.click(item);
    const offered = () => page.$$eval('#rollback-version option', (els) => els.map((e) => (e as HTMLOptionElement).value));
    assert.deepEqual(await offered(), ['1'], 'in the session, every kept version');
    await page.click('#registry-detail [data-action="promote"]');
    await page.waitForSelector(`${item}[data-tier="agent"]`, { timeout: 30_000 });
    await page.click(`${item}[data-tier="agent"]`);
    await page.waitForSelector('#registry-detail [data-action="demote"]');
    // The panel reviewed v2 only: v1 would be refused (unreviewed_version), so it is not offered.
    assert.deepEqual(await offered(), []);
    assert.deepEqual(errors, []);
  });

  test('a forge_tool call whose arguments are broken JSON is told as the forge of an unnamed tool, in the chat and the timeline', async () => {
    const { page, errors } = await openEmergent();
    // A small model's call cut off mid-way: the package reads no name from it.
    mock.setResponder((request) =>
      request.toolNames.length > 0 && request.messages.at(-1)?.role === 'user' ? { toolCalls: [{ name: 'forge_tool', arguments: '{"name": "slugify", "description": ' }] } : scriptedModel(request),
    );
    try {
      await send(page, 'Forge something');
      await lastAgentStatus(page, 'done', 30_000);
    } finally {
      mock.setResponder(scriptedModel);
    }
    assert.match((await page.textContent('.msg-agent:last-of-type .tool-error')) ?? '', /^⚒ forge of an unnamed tool rejected \(parse_error\): could not parse the forge request/);
    assert.equal((await page.textContent('#timeline .tl-card[data-status="rejected"] .tl-title'))?.trim(), 'Forge of an unnamed tool');
    assert.deepEqual(errors, []);
  });

  test('a tool listed in two tiers offers Export and Roll back only on the version the session calls, Demote only on the highest', async () => {
    const { page, errors } = await openEmergent({ promotionUses: '1', autoPromote: '0' });
    const item = '#registry-list [data-tool="slugify"]';
    const hint = () => page.textContent('#registry-detail [data-hint="elsewhere"]');
    const offers = (action: string) => page.$$eval(`#registry-detail [data-action="${action}"]`, (els) => els.length === 1);
    await send(page, 'Slugify “Hello World!” for me');
    await lastAgentStatus(page, 'done', 60_000);
    await page.click(item);
    await page.selectOption('#promote-tier', 'agent');
    await page.click('#registry-detail [data-action="promote"]');
    await page.waitForSelector(`${item}[data-tier="agent"]`, { timeout: 30_000 });
    // v2 (underscores) in this session, over v1 in the agent tier: the package's export and
    // rollback take a name and act on v2, the one the session calls.
    await send(page, 'Slugify with underscores instead');
    await lastAgentStatus(page, 'done', 60_000);
    await page.waitForSelector(`${item}[data-tier="session"]`, { timeout: 30_000 });
    await page.click(`${item}[data-tier="agent"]`);
    await page.waitForSelector('#registry-detail [data-action="demote"]');
    assert.equal(await offers('export'), false, 'no Export that would hand out v2 from v1\'s detail');
    assert.match((await hint()) ?? '', /act on the slugify this session calls: v2 in the session tier/);
    await page.click(`${item}[data-tier="session"]`);
    await page.click('#registry-detail [data-action="export"]');
    await page.waitForFunction(() => /crucible\.tool\.v1/.test(document.querySelector<HTMLTextAreaElement>('#export-text')?.value ?? ''), undefined, { timeout: 10_000 });
    assert.match(await page.inputValue('#export-text'), /^version: 2$/m);
    // v1 goes on to the shared tier, v2 to the agent tier: demote takes the shared one first.
    await page.click(`${item}[data-tier="agent"]`);
    await page.selectOption('#promote-tier', 'shared');
    await page.click('#registry-detail [data-action="promote"]');
    await page.click('#approvals [data-tool="slugify"] [data-action="approve"]');
    await page.waitForSelector(`${item}[data-tier="shared"]`, { timeout: 30_000 });
    await page.click(`${item}[data-tier="session"]`);
    await page.click('#registry-detail [data-action="promote"]');
    await page.waitForSelector(`${item}[data-tier="agent"]`, { timeout: 30_000 });
    await page.click(`${item}[data-tier="agent"]`);
    await page.waitForSelector('#registry-detail [data-hint="elsewhere"]');
    assert.equal(await offers('demote'), false, 'no Demote that would demote the shared v1 from v2\'s detail');
    assert.match((await hint()) ?? '', /Demote acts on the shared tier's slugify first/);
    await page.click(`${item}[data-tier="shared"]`);
    await page.click('#registry-detail [data-action="demote"]');
    await page.waitForFunction(() => document.querySelector('#registry-list [data-tool="slugify"][data-tier="shared"]')?.textContent?.includes('demoted'), undefined, { timeout: 10_000 });
    assert.deepEqual(errors, []);
  });

  test('two forges of one name at once keep to their own cards (a chat run\'s and the example button\'s), the later one rejected', async () => {
    const { page, errors } = await open({ autoPromote: '0' });
    await assertEmergent(page);
    mock.reset();
    const chatForge = { ...SLUGIFY_REQUEST, description: 'Overlapping slugify from the chat' };
    // The chat forge's judge answers first, while the example forge (started after it) still waits for its own.
    mock.setResponder((request) => {
      if (request.toolNames.length === 0) {
        const chat = request.messages.some((m) => /keep letters and digits/.test(m.content ?? ''));
        return { text: JSON.stringify({ ...VERDICT, reasoning: chat ? 'Verdict on the chat forge' : 'Verdict on the example forge' }), delayMs: chat ? 3000 : 6000 };
      }
      if (request.messages.at(-1)?.role === 'tool') return { text: 'Forged.' };
      return { toolCalls: [{ name: 'forge_tool', arguments: chatForge }] };
    });
    try {
      await send(page, 'Forge a slug tool');
      await page.waitForFunction(() => document.querySelectorAll('.tl-card[data-name="slugify"] .test').length === 2, undefined, { timeout: 30_000 });
      await page.click('#forge-example');
      // The example forge, different and registered second, does not replace the chat's tool.
      await page.waitForFunction(() => /^Rejected \(other\): another forge or import registered `slugify` v1/.test(document.querySelector('#forge-example-status')?.textContent ?? ''), undefined, { timeout: 60_000 });
      await lastAgentStatus(page, 'done', 30_000);
      const cards = await page.$$eval('.tl-card[data-name="slugify"]', (els) =>
        els.map((e) => ({
          request: e.querySelector('[data-step="request"]')?.textContent ?? '',
          status: (e as HTMLElement).dataset.status,
          tests: e.querySelectorAll('.test').length,
          verdict: e.querySelector('[data-step="judge"]')?.textContent ?? '',
        })),
      );
      assert.equal(cards.length, 2, JSON.stringify(cards));
      const [chat, example] = cards;
      assert.match(chat!.request, /Overlapping slugify from the chat/);
      assert.match(chat!.verdict, /Verdict on the chat forge/, JSON.stringify(cards));
      assert.match(example!.verdict, /Verdict on the example forge/, JSON.stringify(cards));
      assert.deepEqual(cards.map((card) => [card.status, card.tests]), [['registered', 2], ['rejected', 2]], JSON.stringify(cards));
      assert.deepEqual(errors, []);
    } finally {
      mock.setResponder(scriptedModel);
    }
  });

  test('Apply keeps the session when nothing changed, waits for a forge, and says when a new agent starts', async () => {
    const { page, errors } = await openEmergent();
    // Another model applied while the example forge runs: refused, so the forge's card and status finish.
    await page.evaluate(() => {
      document.querySelector<HTMLInputElement>('#model-name')!.value = 'mock-2';
      document.querySelector<HTMLButtonElement>('#forge-example')!.click();
      document.querySelector<HTMLFormElement>('#settings-form')!.requestSubmit();
    });
    assert.match((await page.textContent('#settings-status')) ?? '', /Wait until the example forge is done/);
    await page.waitForFunction(() => /Registered slugify v1/.test(document.querySelector('#forge-example-status')?.textContent ?? ''), undefined, { timeout: 60_000 });
    await page.waitForSelector('#registry-list [data-tool="slugify"][data-tier="session"]', { timeout: 10_000 });
    assert.equal(await page.$$eval('.tl-card[data-name="slugify"]:not([data-status="registered"])', (els) => els.length), 0);
    // The same settings again: the agent, and with it the session tool, stays.
    await page.click('#settings-details > summary');
    await page.fill('#model-name', 'mock');
    await page.click('#settings-form button[type="submit"]');
    assert.match((await page.textContent('#settings-status')) ?? '', /Same provider/);
    await page.waitForTimeout(1000);
    assert.equal(await page.$$eval('#registry-list [data-tool="slugify"][data-tier="session"]', (els) => els.length), 1, 'the session tool survived the Apply');
    // Another model: a new agent, and the page says what that means.
    await page.fill('#model-name', 'mock-2');
    await page.click('#settings-form button[type="submit"]');
    await page.waitForFunction(() => document.body.dataset.ready === 'true' && document.body.dataset.state === 'idle', undefined, { timeout: 30_000 });
    assert.match((await page.textContent('#settings-status')) ?? '', /new agent started/);
    assert.match((await page.textContent('#transcript .msg-notice')) ?? '', /new agent started/);
    assert.equal(await page.textContent('#forge-example-status'), '', 'no stale "Registered" from the previous agent');
    assert.deepEqual(errors, []);
  });

  test('Apply waits for an automatic promotion the run started, which goes on after the run', async () => {
    // The run's one call of slugify reaches promotionUses: its panel reviews after the run ended.
    const { page, errors } = await openEmergent({ promotionUses: '1' });
    const panel = (request: MockRequest) => request.toolNames.length === 0 && request.messages.some((m) => /reviewer of a promotion panel/.test(m.content ?? ''));
    mock.setResponder((request) => (panel(request) ? { text: JSON.stringify(VERDICT), delayMs: 5000 } : scriptedModel(request)));
    try {
      await send(page, 'Slugify “Hello World!” for me');
      await lastAgentStatus(page, 'done', 60_000);
      await page.waitForFunction(() => document.body.dataset.state === 'idle', undefined, { timeout: 10_000 });
      await page.evaluate(() => {
        document.querySelector<HTMLInputElement>('#model-name')!.value = 'mock-2';
        document.querySelector<HTMLFormElement>('#settings-form')!.requestSubmit();
      });
      assert.match((await page.textContent('#settings-status')) ?? '', /Wait until the automatic promotion is done/);
      // The review finishes in this agent: the tool reaches the agent tier.
      await page.waitForSelector('#registry-list [data-tool="slugify"][data-tier="agent"]', { timeout: 30_000 });
    } finally {
      mock.setResponder(scriptedModel);
    }
    assert.deepEqual(errors, []);
  });

  test('the example forge taken with the keyboard keeps the focus: on its Stop while it runs, back on the button when it ends', async () => {
    const { page, errors } = await openEmergent();
    const focused = () => page.evaluate(() => document.activeElement?.id);
    mock.setResponder((request) => (request.toolNames.length === 0 ? { text: JSON.stringify(VERDICT), delayMs: 60_000 } : { text: 'ok' }));
    try {
      await page.focus('#forge-example');
      await page.keyboard.press('Enter');
      await page.waitForSelector('#forge-example-stop', { state: 'visible', timeout: 5000 });
      assert.equal(await focused(), 'forge-example-stop');
      // Shown disabled while the forge goes, without `disabled` (which drops the focus).
      assert.equal(await page.getAttribute('#forge-example', 'aria-disabled'), 'true');
      assert.equal(await page.evaluate(() => document.querySelector<HTMLButtonElement>('#forge-example')!.disabled), false);
      await page.keyboard.press('Enter');
      await page.waitForFunction(() => /^Stopped: nothing was registered/.test(document.querySelector('#forge-example-status')?.textContent ?? ''), undefined, { timeout: 5000 });
      assert.equal(await focused(), 'forge-example');
    } finally {
      mock.setResponder(scriptedModel);
    }
    // A forge that ends by itself gives the focus back to the button too.
    await page.keyboard.press('Enter');
    await page.waitForFunction(() => /Registered slugify v1/.test(document.querySelector('#forge-example-status')?.textContent ?? ''), undefined, { timeout: 60_000 });
    assert.equal(await focused(), 'forge-example');
    assert.equal(await page.getAttribute('#forge-example', 'aria-disabled'), null);
    assert.deepEqual(errors, []);
  });

  test('a forge stopped mid-way is marked stopped, and keeps the request of a renamed tool', async () => {
    const { page, errors } = await openEmergent();
    await send(page, 'Build a slug maker');
    // The package names the tool Slug_Maker_Tool; the card still shows the forge_tool request.
    const card = '.tl-card[data-name="Slug_Maker_Tool"]';
    await page.waitForFunction((sel) => document.querySelectorAll(`${sel} .test`).length === 2, card, { timeout: 30_000 });
    await page.waitForSelector(`${card} details.tl-json`, { timeout: 10_000 });
    assert.match((await page.textContent(`${card} [data-step="request"]`)) ?? '', /URL slug/);
    // Stopped while the judge thinks: no forge.rejected comes, the card says stopped.
    await page.click('#stop-button');
    await lastAgentStatus(page, 'stopped', 5000);
    await page.waitForSelector(`${card}[data-status="stopped"]`, { timeout: 5000 });
    assert.deepEqual(errors, []);
  });

  test('the example forge can be stopped while its judge thinks: nothing registered, its card stopped, Apply free again', async () => {
    const { page, errors } = await openEmergent();
    // A judge that would take a minute (a small model on a CPU, say).
    mock.setResponder((request) => (request.toolNames.length === 0 ? { text: JSON.stringify(VERDICT), delayMs: 60_000 } : { text: 'ok' }));
    try {
      await page.click('#forge-example');
      const card = '.tl-card[data-name="slugify"]';
      await page.waitForFunction((sel) => document.querySelectorAll(`${sel} .test`).length === 2, card, { timeout: 30_000 });
      assert.equal(await page.isDisabled('#forge-example'), true);
      await page.click('#forge-example-stop');
      await page.waitForFunction(() => /^Stopped: nothing was registered/.test(document.querySelector('#forge-example-status')?.textContent ?? ''), undefined, { timeout: 5000 });
      await page.waitForSelector(`${card}[data-status="stopped"]`, { timeout: 5000 });
      assert.equal(await page.isHidden('#forge-example-stop'), true);
      assert.equal(await page.isDisabled('#forge-example'), false);
      assert.equal(await page.$$eval('#registry-list [data-tool="slugify"]', (els) => els.length), 0, 'nothing registered');
      // Nothing is in flight any more: the same settings applied are not told to wait.
      await page.evaluate(() => document.querySelector<HTMLFormElement>('#settings-form')!.requestSubmit());
      assert.match((await page.textContent('#settings-status')) ?? '', /Same provider/);
    } finally {
      mock.setResponder(scriptedModel);
    }
    assert.deepEqual(errors, []);
  });

  test('a screen reader is not read the whole tool detail after every refresh: only its status line speaks', async () => {
    const { page, errors } = await openEmergent();
    const item = '#registry-list [data-tool="slugify"]';
    await page.click('#forge-example');
    await page.waitForSelector(item, { timeout: 60_000 });
    await page.click(item);
    await page.waitForSelector('#registry-detail .audit-list');
    // Every run's end and every registry event draws the detail again; inside a live region
    // each drawing would be spoken, code and audit trail included.
    const liveRegion = '[aria-live]:not([aria-live="off"]), [role="status"], [role="log"], [role="alert"]';
    const speaking = await page.$$eval('#registry-detail h3, #registry-detail .facts, #registry-detail .code, #registry-detail .audit-list', (els, live) => els.filter((el) => el.closest(live)).map((el) => el.tagName.toLowerCase()), liveRegion);
    assert.deepEqual(speaking, []);
    assert.equal(await page.getAttribute('#registry-detail .action-status', 'role'), 'status', 'action outcomes are still announced');
    assert.deepEqual(errors, []);
  });

  /** A page whose example forge registered slugify in the session tier (promotions only when
   *  asked, none yet), its detail open. */
  async function withSlugifyOpen() {
    const { page, errors } = await open({ promotionUses: '0', autoPromote: '0' });
    await assertEmergent(page);
    const item = '#registry-list [data-tool="slugify"]';
    await page.click('#forge-example');
    await page.waitForSelector(`${item}[data-tier="session"]`, { timeout: 60_000 });
    await page.click(item);
    return { page, errors, item };
  }

  test('a registry action taken with the keyboard leaves the focus in the tool\'s detail, not at the top of the page', async () => {
    const { page, errors, item } = await withSlugifyOpen();
    const focusIn = () => page.evaluate(() => (document.activeElement?.closest('#registry-detail') ? (document.activeElement as HTMLElement).dataset.action ?? 'detail' : document.activeElement?.tagName));
    const byKeyboard = async (action: string, done: string) => {
      await page.focus(`#registry-detail [data-action="${action}"]`);
      await page.keyboard.press('Enter');
      await page.waitForSelector(done, { timeout: 30_000 });
      await page.waitForTimeout(500); // the refresh after the action draws the detail again
    };
    await byKeyboard('export', '#export-text');
    assert.equal(await focusIn(), 'export', 'Export keeps the focus');
    await byKeyboard('promote', `${item}[data-tier="agent"]`);
    assert.equal(await focusIn(), 'promote', 'the agent tier offers a promotion too: the focus stays on it');
    await byKeyboard('demote', `${item}[data-tier="session"]`);
    assert.equal(await focusIn(), 'detail', 'no Demote in the session tier: the focus is on the detail');
    // The import button too.
    await page.fill('#import-text', 'not a package');
    await page.focus('#import-button');
    await page.keyboard.press('Enter');
    await page.waitForFunction(() => /^Import failed/.test(document.querySelector('#import-status')?.textContent ?? ''), undefined, { timeout: 10_000 });
    assert.equal(await page.evaluate(() => document.activeElement?.id), 'import-button');
    assert.deepEqual(errors, []);
  });

  test('a promotion denied with the keyboard leaves the focus in the approvals panel, not at the top of the page', async () => {
    const { page, errors, item } = await withSlugifyOpen();
    await page.click('#registry-detail [data-action="promote"]');
    await page.waitForSelector(`${item}[data-tier="agent"]`, { timeout: 30_000 });
    await page.click('#registry-detail [data-action="promote"]');
    await page.waitForSelector('#approvals [data-tool="slugify"] .deny-reason', { timeout: 30_000 });
    // Out of context (a screen reader's list of buttons), each control says whose it is.
    const names = await page.$$eval('#approvals [data-tool="slugify"] :is(button, input)', (els) => els.map((el) => el.getAttribute('aria-label')));
    assert.deepEqual(names, ['Approve the promotion of slugify', 'Why the promotion of slugify is denied', 'Deny the promotion of slugify']);
    await page.focus('#approvals [data-tool="slugify"] .deny-reason');
    await page.keyboard.type('not yet');
    await page.keyboard.press('Tab');
    assert.equal(await page.evaluate(() => (document.activeElement as HTMLElement | null)?.dataset.action), 'deny');
    await page.keyboard.press('Enter');
    await page.waitForFunction(() => document.querySelectorAll('#approvals [data-approval]').length === 0, undefined, { timeout: 10_000 });
    await page.waitForTimeout(300);
    assert.equal(await page.evaluate(() => document.activeElement?.closest('#approvals-panel') !== null), true, `focus on ${await page.evaluate(() => document.activeElement?.tagName)}`);
    assert.deepEqual(errors, []);
  });

  test('a double click on Import imports the package once', async () => {
    const { page, errors } = await openEmergent();
    const item = '#registry-list [data-tool="slugify"]';
    await exportExampleToImport(page);
    // v1's package is new to the session once v2 is current (the same as v1 it would be kept as is).
    await send(page, 'Make a slug of this');
    await page.waitForFunction(() => /v2/.test(document.querySelector('#registry-list [data-tool="slugify"]')?.textContent ?? ''), undefined, { timeout: 30_000 });
    await lastAgentStatus(page, 'done');
    const judgedBefore = mock.requests.filter((r) => r.toolNames.length === 0).length;
    await page.dblclick('#import-button');
    await page.waitForFunction(() => /^Imported/.test(document.querySelector('#import-status')?.textContent ?? ''), undefined, { timeout: 30_000 });
    await page.waitForTimeout(1000);
    assert.equal(mock.requests.filter((r) => r.toolNames.length === 0).length - judgedBefore, 1, 'the judge was asked once');
    assert.match((await page.textContent(item)) ?? '', /v3/, 'one new version');
    assert.deepEqual(errors, []);
  });

  test('an import whose judge does not answer can be stopped, and nothing is recorded', async () => {
    const { page, errors } = await openEmergent();
    const item = '#registry-list [data-tool="slugify"]';
    await exportExampleToImport(page);
    // v1's package is new to the session once v2 is current (the same as v1 it would be kept as is, with no judge to wait for).
    await send(page, 'Make a slug of this');
    await page.waitForFunction(() => /v2/.test(document.querySelector('#registry-list [data-tool="slugify"]')?.textContent ?? ''), undefined, { timeout: 30_000 });
    await lastAgentStatus(page, 'done');
    assert.equal(await page.isVisible('#import-stop'), false, 'no Stop before an import');
    mock.setResponder((request) => (request.toolNames.length === 0 ? { text: JSON.stringify(VERDICT), delayMs: 60_000 } : scriptedModel(request)));
    try {
      await page.click('#import-button');
      await page.waitForSelector('#import-stop', { state: 'visible', timeout: 10_000 });
      const started = Date.now();
      await page.click('#import-stop');
      await page.waitForFunction(() => /^Import stopped: nothing was recorded/.test(document.querySelector('#import-status')?.textContent ?? ''), undefined, { timeout: 5000 });
      assert.ok(Date.now() - started < 5000, 'stopped promptly');
      assert.equal(await page.isVisible('#import-stop'), false);
      assert.equal(await page.inputValue('#import-text') !== '', true, 'the package stays, to try again');
      await page.waitForTimeout(500);
      assert.match((await page.textContent(item)) ?? '', /v2/, 'no new version');
    } finally {
      mock.setResponder(scriptedModel);
    }
    assert.deepEqual(errors, []);
  });

  test('a tool with a long name (64 characters, the most the package takes) does not widen the page at phone width', async () => {
    const { page, errors } = await open({ promotionUses: '0', autoPromote: '0' }, PHONE);
    await assertEmergent(page);
    const name = 'convert_a_text_into_a_url_slug_with_dashes_between_all_the_words';
    assert.equal(name.length, 64);
    mock.setResponder((request) => {
      if (request.toolNames.length === 0) return { text: JSON.stringify(VERDICT) };
      if (request.messages.at(-1)?.role === 'tool') return { text: 'Forged.' };
      return { toolCalls: [{ name: 'forge_tool', arguments: { ...SLUGIFY_REQUEST, name } }] };
    });
    try {
      await send(page, 'Forge a slug tool with a long name');
      await lastAgentStatus(page, 'done', 30_000);
      const item = `#registry-list [data-tool="${name}"]`;
      await page.waitForSelector(item, { timeout: 10_000 });
      // Its promotion to the shared tier waits for a human: the name is on an approval card too.
      await page.click(item);
      await page.click('#registry-detail [data-action="promote"]');
      await page.waitForSelector(`${item}[data-tier="agent"]`, { timeout: 30_000 });
      await page.click(item);
      await page.click('#registry-detail [data-action="promote"]');
      await page.waitForSelector(`#approvals [data-tool="${name}"]`, { timeout: 30_000 });
    } finally {
      mock.setResponder(scriptedModel);
    }
    await shot(page, 'long-name-phone', PHONE);
    // Everything wider than the window, outside code blocks (which scroll on their own).
    const wide = await page.evaluate(() =>
      [...document.querySelectorAll('body *')]
        .filter((el) => !el.closest('pre') && (el.getBoundingClientRect().right > window.innerWidth + 1 || el.scrollWidth > el.clientWidth + 1) && getComputedStyle(el).overflowX === 'visible')
        .map((el) => `${el.tagName.toLowerCase()}.${el.className}`),
    );
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflow <= 0, `no horizontal scrolling at 375 px (overflow ${overflow}px: ${wide.join(', ')})`);
    assert.deepEqual(errors, []);
  });

  describe('forge, promotion, reload (emergent API)', () => {
    let opened: Opened;
    let context: BrowserContext;

    before(async () => {
      context = await browser.newContext({ viewport: DESKTOP });
      contexts.push(context);
      opened = await open({ promotionUses: '1', autoPromote: '0' }, DESKTOP, context);
    });

    test('a chat run forges a tool and shows its timeline', async () => {
      const { page, errors } = opened;
      await assertEmergent(page);
      mock.reset();
      await send(page, 'Slugify “Hello World!” for me');
      const card = '.tl-card[data-name="slugify"]';
      await page.waitForSelector(`${card}[data-status="registered"]`, { timeout: 60_000 });
      assert.equal(await page.$$eval(`${card} .test[data-passed="true"]`, (els) => els.length), 2);
      assert.match((await page.textContent(`${card} [data-step="judge"]`)) ?? '', /approves, confidence 90%/);
      assert.match((await page.textContent(`${card} [data-step="registered"]`)) ?? '', /session tier, version 1/);
      await lastAgentStatus(page, 'done', 60_000);
      await page.waitForSelector('#registry-list [data-tool="slugify"]', { timeout: 10_000 });
      await page.click('#registry-list [data-tool="slugify"]');
      await page.waitForSelector('#registry-detail .code .tok-keyword');
      // The registry's buttons are named by what they show (a speech user says what they see).
      assert.equal(await page.getByRole('button', { name: 'slugify session v1', exact: true }).count(), 1);
      // The forge_tool arguments scroll: the keyboard reaches them (axe: scrollable-region-focusable).
      await page.click(`${card} details.tl-json > summary`);
      assert.equal(await page.getAttribute(`${card} details.tl-json pre`, 'tabindex'), '0');
      await shot(page, 'forge-desktop');
      assert.deepEqual(await accessibilityViolations(page), [], 'axe-core after a forge: timeline (the request open), chart, registry, code');
      await shot(page, 'forge-phone', PHONE);
      await page.setViewportSize(DESKTOP);
      assert.deepEqual(errors, []);
    });

    test('a shared promotion waits for approval and lands once approved', async () => {
      const { page, errors } = opened;
      await assertEmergent(page);
      await page.click('#registry-list [data-tool="slugify"]');
      await page.selectOption('#promote-tier', 'agent');
      await page.click('#registry-detail [data-action="promote"]');
      await page.waitForSelector('#registry-list [data-tool="slugify"][data-tier="agent"]', { timeout: 30_000 });
      await page.click('#registry-list [data-tool="slugify"]');
      await page.selectOption('#promote-tier', 'shared');
      await page.click('#registry-detail [data-action="promote"]');
      await page.waitForSelector('#approvals [data-tool="slugify"] [data-action="approve"]', { timeout: 30_000 });
      // The card names the version it promotes (a newer one is not promoted by this approval).
      await page.waitForSelector('#approvals [data-tool="slugify"] .approval-version', { timeout: 10_000 });
      assert.match((await page.textContent('#approvals [data-tool="slugify"] .approval-version')) ?? '', /^version 1, hash \S{12}$/);
      await shot(page, 'approval-pending');
      await page.click('#approvals [data-tool="slugify"] [data-action="approve"]');
      await page.waitForSelector('#registry-list [data-tool="slugify"][data-tier="shared"]', { timeout: 30_000 });
      await page.waitForSelector('#timeline .tl-promoted', { timeout: 10_000 });
      assert.match((await page.getAttribute('#stats svg', 'aria-label')) ?? '', /1 approved/);
      assert.equal(await page.$$eval('#approvals [data-approval]', (els) => els.length), 0);
      await shot(page, 'approval-done');
      assert.deepEqual(errors, []);
    });

    test('reload keeps the registry, the stats and the audit trail', async () => {
      const { page, errors } = opened;
      await assertEmergent(page);
      await page.reload();
      await waitReady(page);
      await assertEmergent(page);
      await page.waitForSelector('#registry-list [data-tool="slugify"]', { timeout: 20_000 });
      const tier = await page.getAttribute('#registry-list [data-tool="slugify"]', 'data-tier');
      assert.ok(tier === 'agent' || tier === 'shared', `slugify survived the reload (tier ${tier})`);
      await page.click('#registry-list [data-tool="slugify"]');
      assert.ok((await page.$$eval('#registry-detail .audit-list li', (els) => els.length)) > 0, 'audit trail kept');
      // Per-tool stats and the forge statistics are persisted in IndexedDB.
      assert.match((await page.textContent('#registry-detail [data-fact="calls"]')) ?? '', /^[1-9]/, 'slugify call count kept');
      assert.match((await page.textContent('#registry-detail [data-fact="success-rate"]')) ?? '', /100%/);
      assert.match((await page.getAttribute('#stats svg', 'aria-label')) ?? '', /[1-9]\d* approved/, 'forge statistics kept');
      await shot(page, 'reload-desktop');
      assert.deepEqual(errors, []);
    });

    test('demote, deny a promotion, export and import a package', async () => {
      const { page, errors } = opened;
      await assertEmergent(page);
      const item = '#registry-list [data-tool="slugify"]';
      await page.click(item);
      const before = await page.getAttribute(item, 'data-tier');
      await page.click('#registry-detail [data-action="demote"]');
      const lower = before === 'shared' ? 'agent' : 'session';
      await page.waitForSelector(`${item}[data-tier="${lower}"]`, { timeout: 10_000 });
      await page.waitForSelector('#timeline .tl-demoted', { timeout: 10_000 });
      // A shared promotion denied by the human: nothing moves.
      await page.click(item);
      await page.selectOption('#promote-tier', 'shared');
      await page.click('#registry-detail [data-action="promote"]');
      await page.waitForSelector('#approvals [data-tool="slugify"] [data-action="deny"]', { timeout: 30_000 });
      await page.fill('#approvals [data-tool="slugify"] .deny-reason', 'not for everyone yet');
      await page.click('#approvals [data-tool="slugify"] [data-action="deny"]');
      await page.waitForFunction(() => document.querySelectorAll('#approvals [data-approval]').length === 0, undefined, { timeout: 10_000 });
      // The timeline shows the refusal with the human's reason.
      await page.waitForFunction(() => /not for everyone yet/.test(document.querySelector('#timeline .tl-promotion-rejected')?.textContent ?? ''), undefined, { timeout: 10_000 });
      assert.equal(await page.getAttribute(item, 'data-tier'), lower);
      await page.click(item);
      await page.waitForSelector('#registry-detail .audit-list li[data-action="approval.denied"]', { timeout: 10_000 });
      // Export shows the portable package (source kept: persistSandboxSource).
      await page.click('#registry-detail [data-action="export"]');
      await page.waitForFunction(() => /crucible\.tool\.v1/.test((document.querySelector('#export-text') as HTMLTextAreaElement | null)?.value ?? ''), undefined, { timeout: 10_000 });
      const pkg = await page.inputValue('#export-text');
      assert.match(pkg, /toLowerCase/);
      await shot(page, 'export');
      // The session already has this very tool: the import answers with it as it is.
      await page.fill('#import-text', pkg);
      await page.click('#import-button');
      await page.waitForFunction(() => !/Importing/.test(document.querySelector('#import-status')?.textContent ?? 'Importing'), undefined, { timeout: 30_000 });
      const status = (await page.textContent('#import-status')) ?? '';
      assert.match(status, /^Imported slugify: the same as v\d+ here \(\w+ tier\), so nothing was tested or judged again\./, status);
      await shot(page, 'import');
      assert.deepEqual(errors, []);
    });

    test('a re-forged tool gets a new version; rollback restores the old one', async () => {
      const { page, errors } = opened;
      await assertEmergent(page);
      await send(page, 'Slugify with underscores instead');
      await lastAgentStatus(page, 'done', 60_000);
      const item = '#registry-list [data-tool="slugify"][data-tier="session"]';
      // v1 was imported again unchanged: the re-forge is v2.
      await page.waitForFunction((sel) => /v[2-9]/.test(document.querySelector(sel)?.textContent ?? ''), item, { timeout: 10_000 });
      await page.click(item);
      await page.waitForSelector('#rollback-version');
      const newest = (await page.textContent(`${item} .muted`))!.trim();
      const target = await page.$eval('#rollback-version', (el) => (el as HTMLSelectElement).options[(el as HTMLSelectElement).options.length - 1]!.value);
      await page.selectOption('#rollback-version', target);
      await page.click('#registry-detail [data-action="rollback"]');
      await page.waitForFunction(([sel, v]) => (document.querySelector(sel!)?.textContent ?? '').includes(`v${v}`), [item, target], { timeout: 10_000 });
      assert.notEqual(`v${target}`, newest);
      await page.click(item);
      await page.waitForSelector('#registry-detail .audit-list li[data-action="rollback"]');
      await shot(page, 'rollback');
      assert.deepEqual(errors, []);
    });
  });

  test('streams an answer from the real local model', async (t) => {
    const reachable = await fetch(`${LOCAL_MODEL}/models`, { signal: AbortSignal.timeout(2000) }).then((r) => r.ok, () => false);
    if (!reachable) {
      if (process.env.CRUCIBLE_REQUIRE_LOCAL_MODEL === '1') assert.fail(`the local model is not reachable at ${LOCAL_MODEL}`);
      t.skip(`the local model is not running at ${LOCAL_MODEL} (scripts/model/start.sh starts it)`);
      return;
    }
    const { page, errors } = await open({ provider: 'local', baseURL: LOCAL_MODEL, model: 'qwen' });
    await send(page, 'Reply with one short friendly sentence greeting the reader.');
    await page.waitForFunction(() => (document.querySelector('.msg-agent:last-of-type .msg-text')?.textContent ?? '').length > 0 || document.querySelector('.msg-agent:last-of-type')?.getAttribute('data-status') !== 'streaming', undefined, { timeout: 120_000 });
    await lastAgentStatus(page, 'done', 180_000);
    const answer = (await page.textContent('.msg-agent:last-of-type .msg-body')) ?? '';
    assert.ok(answer.trim().length > 0, 'a non-empty answer');
    await shot(page, 'local-model');
    assert.deepEqual(errors, []);
  });
});

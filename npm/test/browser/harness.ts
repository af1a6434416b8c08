/**
 * Browser test harness: a static file server on 127.0.0.1, Debian's Chromium driven by
 * `playwright-core`, and pages that record their console errors, page errors and failed
 * requests and can save screenshots under `<repo>/test-artifacts/` (git-ignored).
 *
 * Used by every browser test (package smoke test, IndexedDB stores, packaging, demo pages) and
 * by `bench/stores.browser.bench.ts`. Everything stays on loopback; Chromium is started with
 * networking features that phone home switched off, in a fresh profile made by playwright.
 *
 * Code that runs in the page is plain JavaScript in `test/browser/pages/` (or a bundle), and
 * is called with {@link callInPage} by name with JSON arguments — never by passing a function
 * to `page.evaluate`, whose source tsx may have rewritten with helpers the page lacks.
 */

import assert from 'node:assert/strict';
import { existsSync, mkdirSync, statSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createRequire } from 'node:module';
import { dirname, extname, join, resolve, sep } from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import type { Browser, BrowserContext, Page } from 'playwright-core';

/** The repository root (this file is `<repo>/npm/test/browser/harness.ts`). */
export const repoRoot = fileURLToPath(new URL('../../../', import.meta.url));
/** The package folder `<repo>/npm`. */
export const packageRoot = fileURLToPath(new URL('../../', import.meta.url));
/** Plain-JS pages and scripts the browser tests serve. */
export const pagesRoot = fileURLToPath(new URL('./pages/', import.meta.url));
/** Screenshots and other leftovers for a person to look at (git-ignored). */
export const artifactsDir = join(repoRoot, 'test-artifacts');

/** Debian's Chromium; `CRUCIBLE_CHROMIUM` overrides. */
export const chromiumPath = process.env.CRUCIBLE_CHROMIUM ?? '/usr/bin/chromium';

/** Flags that keep Chromium quiet, offline and runnable as root in a container. */
export const chromiumArgs = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--disable-dev-shm-usage',
];

/**
 * Why browser tests cannot run here, or `undefined` when they can. Chromium missing is a
 * reason to skip on a developer's machine and a failure under `CI=true`.
 */
export function browserUnavailable(): string | undefined {
  if (!existsSync(chromiumPath)) {
    return `Chromium not found at ${chromiumPath} (apt-get install chromium, or set CRUCIBLE_CHROMIUM)`;
  }
  return undefined;
}

const inCi = process.env.CI === 'true' || process.env.CI === '1';

/**
 * `describe` for a suite that needs Chromium. Without Chromium it is skipped with the reason
 * printed — except under CI=true, where a single failing test says what is missing.
 */
export function describeInBrowser(name: string, body: () => void): void {
  const missing = browserUnavailable();
  if (missing === undefined) {
    describe(name, body);
  } else if (inCi) {
    describe(name, () => {
      test('Chromium is available (required under CI=true)', () => assert.fail(missing));
    });
  } else {
    console.error(`# SKIP ${name}: ${missing}`);
    test(name, { skip: missing }, () => {});
  }
}

/** Launches headless Chromium with a fresh profile. Close it in `after`. */
export async function launchChromium(): Promise<Browser> {
  const { chromium } = await import('playwright-core');
  return chromium.launch({ executablePath: chromiumPath, args: chromiumArgs, timeout: 60_000 });
}

// ---------------------------------------------------------------------------------------------
// Static server

const mimeTypes: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.cjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json; charset=utf-8',
  '.map': 'application/json; charset=utf-8',
  '.wasm': 'application/wasm',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
  '.txt': 'text/plain; charset=utf-8',
  '.ts': 'text/plain; charset=utf-8',
};

/** The MIME type the server sends for a path. */
export function mimeType(path: string): string {
  return mimeTypes[extname(path).toLowerCase()] ?? 'application/octet-stream';
}

/** Options of {@link startStaticServer}. */
export interface StaticServerOptions {
  /** URL prefix → folder. `{ '/': dist }` serves a folder at the root; longest prefix wins. */
  mounts: Record<string, string>;
  /** Exact URL paths answered from memory (generated pages), before the mounts. */
  files?: Record<string, string | Uint8Array>;
}

/** A running static server. */
export interface StaticServer {
  /** `http://127.0.0.1:<port>` */
  readonly url: string;
  /** Every request path served 404, to explain a failing page. */
  readonly notFound: string[];
  close(): Promise<void>;
}

/**
 * Serves files on 127.0.0.1 (ephemeral port) with the right MIME types (`.wasm` as
 * `application/wasm`, so streaming compilation works) and `Cache-Control: no-store`. A folder
 * serves its `index.html`. Paths that climb out of a mount are refused. `/favicon.ico`
 * without a file is `204`, so pages log no error for it.
 */
export async function startStaticServer(options: StaticServerOptions): Promise<StaticServer> {
  const mounts = Object.entries(options.mounts)
    .map(([prefix, dir]) => [prefix.endsWith('/') ? prefix : `${prefix}/`, resolve(dir)] as const)
    .sort(([a], [b]) => b.length - a.length);
  const files = options.files ?? {};
  const notFound: string[] = [];

  const locate = (path: string): string | undefined => {
    for (const [prefix, dir] of mounts) {
      if (!path.startsWith(prefix)) continue;
      let file = resolve(dir, `.${sep}${path.slice(prefix.length)}`);
      if (file !== dir && !file.startsWith(dir + sep)) return undefined;
      if (existsSync(file) && statSync(file).isDirectory()) file = join(file, 'index.html');
      if (existsSync(file) && statSync(file).isFile()) return file;
    }
    return undefined;
  };

  const server: Server = createServer((req, res) => {
    void (async () => {
      let path: string;
      try {
        path = decodeURIComponent(new URL(req.url ?? '/', 'http://static').pathname);
      } catch {
        res.writeHead(400).end();
        return;
      }
      const headers = { 'cache-control': 'no-store', 'access-control-allow-origin': '*' };
      const inline = files[path];
      if (inline !== undefined) {
        res.writeHead(200, { ...headers, 'content-type': mimeType(path.endsWith('/') ? 'index.html' : path) }).end(inline);
        return;
      }
      const file = locate(path);
      if (file === undefined) {
        if (path === '/favicon.ico') {
          res.writeHead(204, headers).end();
          return;
        }
        notFound.push(path);
        res.writeHead(404, { ...headers, 'content-type': 'text/plain' }).end(`not found: ${path}`);
        return;
      }
      const body = await readFile(file);
      res.writeHead(200, { ...headers, 'content-type': mimeType(file), 'content-length': body.length });
      res.end(req.method === 'HEAD' ? undefined : body);
    })().catch((error: unknown) => {
      if (!res.headersSent) res.writeHead(500, { 'content-type': 'text/plain' });
      res.end(String(error));
    });
  });
  await new Promise<void>((ok, fail) => {
    server.once('error', fail);
    server.listen(0, '127.0.0.1', () => ok());
  });
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    notFound,
    close: () =>
      new Promise<void>((ok) => {
        server.closeAllConnections();
        server.close(() => ok());
      }),
  };
}

// ---------------------------------------------------------------------------------------------
// Pages

/** A page whose problems are recorded as they happen. */
export interface WatchedPage {
  readonly page: Page;
  /** `console.error` messages (and `console.assert` failures). */
  readonly consoleErrors: string[];
  /** Uncaught exceptions and unhandled rejections in the page. */
  readonly pageErrors: string[];
  /** Requests that failed at the network level or answered >= 400. */
  readonly failedRequests: string[];
  /** Everything the page logged, for failure messages. */
  readonly log: string[];
  /** Asserts the page logged no error, threw nothing and no request failed. */
  assertClean(): void;
  /** Saves `<repo>/test-artifacts/<name>.png` and returns its path. */
  screenshot(name: string): Promise<string>;
}

/** Wraps an existing page with recorders (a second tab, a reopened page). */
export function watchPage(page: Page): WatchedPage {
  const consoleErrors: string[] = [];
  const pageErrors: string[] = [];
  const failedRequests: string[] = [];
  const log: string[] = [];
  page.on('console', (msg) => {
    const line = `[${msg.type()}] ${msg.text()}`;
    log.push(line);
    if (msg.type() === 'error' || msg.type() === 'assert') consoleErrors.push(msg.text());
  });
  page.on('pageerror', (error) => {
    pageErrors.push(`${error.name}: ${error.message}`);
    log.push(`[pageerror] ${error.stack ?? error.message}`);
  });
  page.on('requestfailed', (request) => {
    // An aborted fetch is a request the page meant to cancel, not a failure.
    const reason = request.failure()?.errorText ?? 'failed';
    if (reason === 'net::ERR_ABORTED') return;
    failedRequests.push(`${request.method()} ${request.url()}: ${reason}`);
  });
  page.on('response', (response) => {
    if (response.status() >= 400) failedRequests.push(`${response.request().method()} ${response.url()}: HTTP ${response.status()}`);
  });
  return {
    page,
    consoleErrors,
    pageErrors,
    failedRequests,
    log,
    assertClean() {
      const problems = [
        ...consoleErrors.map((e) => `console.error: ${e}`),
        ...pageErrors.map((e) => `page error: ${e}`),
        ...failedRequests.map((e) => `request: ${e}`),
      ];
      assert.deepEqual(problems, [], `the page reported problems:\n${problems.join('\n')}\n--- page log ---\n${log.join('\n')}`);
    },
    async screenshot(name: string) {
      mkdirSync(artifactsDir, { recursive: true });
      const path = join(artifactsDir, `${name.replace(/[^\w.-]+/g, '-')}.png`);
      await page.screenshot({ path, fullPage: true });
      return path;
    },
  };
}

/** Opens `url` in a new page of `context` (or a new context of `browser`), recording problems. */
export async function openPage(target: Browser | BrowserContext, url: string): Promise<WatchedPage> {
  const page = await target.newPage();
  page.setDefaultTimeout(30_000);
  const watched = watchPage(page);
  await page.goto(url, { waitUntil: 'load' });
  return watched;
}

/**
 * Calls `window[name](...args)` in the page (awaiting a returned promise) and returns the
 * JSON result. Arguments and result cross as JSON.
 */
export async function callInPage<T = unknown>(page: Page, name: string, ...args: unknown[]): Promise<T> {
  const call = `window[${JSON.stringify(name)}](...${JSON.stringify(args)})`;
  return (await page.evaluate(`(async () => { await window.__ready; return await ${call}; })()`)) as T;
}

/**
 * An HTML page with an import map and one module script. Sets `window.__ready`, a promise
 * that settles once the module ran, so {@link callInPage} never races the module.
 */
export function modulePage(options: { title: string; imports: Record<string, string>; module: string; body?: string }): string {
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>${options.title}</title>
<link rel="icon" href="data:,">
<script type="importmap">${JSON.stringify({ imports: options.imports })}</script>
<script>window.__ready = new Promise((ok, fail) => { window.__readyOk = ok; window.__readyFail = fail; });</script>
</head>
<body>
${options.body ?? ''}
<script type="module">
try {
  await import(${JSON.stringify(options.module)});
  window.__readyOk();
} catch (error) {
  window.__readyFail(error);
  throw error;
}
</script>
</body>
</html>
`;
}

/**
 * Serves the built package (`dist/`, `wasm/`) and its one runtime dependency behind an import
 * map, with `page` (a module of test/browser/pages/) as the page's module. `files` are served
 * too (and stay live: a test may delete an entry to break a path).
 */
export async function importMapSite(page: string, title: string, files: Record<string, string> = {}): Promise<StaticServer> {
  for (const built of ['dist/browser.js', 'wasm/crucible_core_bg.wasm']) {
    assert.ok(existsSync(join(packageRoot, built)), `${built} is missing: run \`npm run build\` (or \`npm run build:ts\` when the wasm is built) first`);
  }
  const parser = dirname(createRequire(join(packageRoot, 'package.json')).resolve('eventsource-parser'));
  return startStaticServer({
    mounts: { '/pkg/': packageRoot, '/deps/eventsource-parser/': parser, '/pages/': pagesRoot },
    files: Object.assign(files, {
      '/': modulePage({
        title,
        imports: { 'crucible-agents': '/pkg/dist/browser.js', 'eventsource-parser': '/deps/eventsource-parser/index.js' },
        module: `/pages/${page}`,
      }),
    }),
  });
}

// The sandbox in Chromium: `createSandbox()` from the built package, loaded (a) as a Vite 7
// bundle — how the demo page and most apps load it — and (b) as plain ES modules behind an
// import map over dist/. Every adversarial case of test/support/sandbox-cases.ts runs in the
// page and must be contained as in Node: the expected status and code, no host secret in the
// result, the call ended within the deadline + browser slack, the next execution succeeds.
// Also measures the warm-pool latency of the slugify tool and the time to replace a killed
// worker, printed as `# ...` lines.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import type { Server } from 'node:http';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { Browser } from 'playwright-core';
import type { SandboxRequest, SandboxResult, SandboxStats } from '../src/sandbox/index.js';
import { startFetchServer } from './support/fetch-target-server.js';
import { CASE_OPTIONS, PROBE, PROBE_OUTPUT, RUNS_UNTIL_THE_DEADLINE, SANDBOX_CASES, type CaseContext } from './support/sandbox-cases.js';
import { callInPage, describeInBrowser, launchChromium, openPage, packageRoot, type StaticServer, type WatchedPage } from './browser/harness.js';
import { importMapSandboxSite, viteSandboxSite } from './browser/sandbox-sites.js';

/** A Worker script the tests can make fail to load (by serving nothing at its path). */
const FLAKY_WORKER = "import '/pkg/dist/sandbox/worker.js';\n";

/** A SharedWorker (which has no Worker constructor in Chromium) that starts a sandbox and
 *  reports how that went. */
const SHARED_WORKER = `import { createSandbox } from '/pkg/dist/sandbox/index.js';
onconnect = (event) => {
  const port = event.ports[0];
  createSandbox({ lazy: true }).then(() => port.postMessage('started'), (error) => port.postMessage(error.name + ': ' + error.message));
};
`;

const HOST_SECRET = 'host-secret-7f3a';
/** Chromium's timers, worker termination and message hops are slower than Node's. */
const BROWSER_SLACK_MS = 250;
const SLUGIFY = "function execute(input){const s=input.text.toLowerCase().replace(/[^a-z0-9]+/g,'-').replace(/^-|-$/g,'');return {slug:s};}";


interface RunOutcome {
  result: SandboxResult;
  wallMs: number;
  probe?: SandboxResult;
  heapGrowth: number;
  stats: SandboxStats;
}

describeInBrowser('the sandbox in Chromium', () => {
  let browser: Browser;
  let fetchServer: Server;
  let ctx: CaseContext;
  const hostsSeen: string[] = [];

  before(async () => {
    for (const built of ['dist/browser.js', 'dist/sandbox/worker.js', 'wasm/crucible_sandbox_bg.wasm']) {
      assert.ok(existsSync(join(packageRoot, built)), `${built} is missing: run \`npm run build\` first`);
    }
    ({ server: fetchServer, ctx } = await startFetchServer(hostsSeen));
    browser = await launchChromium();
  });
  after(async () => {
    await browser?.close();
    fetchServer?.close();
  });

  for (const setup of ['vite', 'import map'] as const) {
    describe(`loaded ${setup === 'vite' ? 'from a Vite 7 bundle' : 'as ES modules behind an import map'}`, () => {
      let site: StaticServer;
      let tab: WatchedPage;
      /** Import-map setup: a worker entry the test can make disappear (`delete`). */
      const flaky: Record<string, string> = { '/flaky/worker.js': FLAKY_WORKER, '/shared/worker.js': SHARED_WORKER };

      before(async () => {
        if (setup === 'vite') {
          const built = await viteSandboxSite();
          site = built.site;
          console.log(`# vite sandbox bundle: ${built.assets.join(', ')}`);
        } else {
          site = await importMapSandboxSite(flaky);
        }
        tab = await openPage(browser, `${site.url}/`);
        const { startMs } = await callInPage<{ startMs: number }>(tab.page, 'sandboxStart', { ...CASE_OPTIONS, maxFetchBodyBytes: 1024 * 1024 });
        console.log(`# [${setup}] createSandbox (2 warm workers, wasm compiled) in ${startMs.toFixed(1)} ms`);
      });
      after(async () => {
        if (tab) await callInPage(tab.page, 'sandboxClose').catch(() => {});
        await tab?.page.close();
        await site?.close();
      });

      test('the public API runs sync and async execute with input, logs and crypto', async () => {
        const { result: r } = await callInPage<RunOutcome>(tab.page, 'sandboxRun', {
          code: 'async function execute(input) { console.log("hi", input.n); return { n: input.n + 1 }; }',
          input: { n: 1 },
        });
        assert.equal(r.status, 'ok', JSON.stringify(r) + `\n${tab.log.join('\n')}\nnot found: ${site.notFound.join(', ')}`);
        assert.deepEqual(r.output, { n: 2 });
        assert.deepEqual(r.logs, ['hi 1']);
        const { result: c } = await callInPage<RunOutcome>(tab.page, 'sandboxRun', { code: 'function execute(){ return crypto.sha256("abc"); }', allowlist: ['crypto'] });
        assert.equal(c.output, 'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad');
      });

      for (const c of SANDBOX_CASES) {
        test(`[${c.category}] ${c.name}`, async () => {
          const request: SandboxRequest = c.request(ctx);
          const { result: r, wallMs, probe, heapGrowth } = await callInPage<RunOutcome>(tab.page, 'sandboxRun', JSON.stringify(request), PROBE);
          const statuses = c.browser?.status ?? (Array.isArray(c.status) ? c.status : [c.status]);
          assert.ok(statuses.includes(r.status), `status ${r.status} not in ${statuses.join('|')}: ${JSON.stringify(r)}`);
          if (c.code) {
            const codes = [...(Array.isArray(c.code) ? c.code : [c.code]), ...(r.status === 'timeout' ? ['deadline'] : [])];
            assert.ok(codes.includes(r.error?.code ?? ''), `code ${r.error?.code} not in ${codes.join('|')}: ${JSON.stringify(r)}`);
          }
          (c.browser?.check ?? c.check)?.(r, ctx);
          assert.ok(!JSON.stringify(r).includes(HOST_SECRET), 'a host secret reached the result');
          assert.ok(wallMs <= CASE_OPTIONS.timeoutMs + BROWSER_SLACK_MS, `took ${wallMs.toFixed(0)} ms`);
          assert.equal(probe?.status, 'ok', JSON.stringify(probe));
          assert.deepEqual(probe.output, PROBE_OUTPUT);
          assert.ok(heapGrowth < 32 * 1024 * 1024, `page heap grew by ${(heapGrowth / 1048576).toFixed(1)} MB`);
        });
      }

      test('refused fetches never reached a non-allowlisted host', () => {
        assert.ok(hostsSeen.length > 0);
        for (const host of hostsSeen) assert.equal(host, `127.0.0.1:${ctx.port}`, `request reached host '${host}'`);
      });

      test('a timed-out worker is replaced and the pool keeps serving in parallel', async () => {
        const { results, stats } = await callInPage<{ results: SandboxResult[]; stats: SandboxStats }>(tab.page, 'sandboxRunAll', [
          { code: RUNS_UNTIL_THE_DEADLINE },
          { code: 'function execute(){ return 1; }' },
          { code: 'function execute(){ return 2; }' },
          { code: 'function execute(){ return 3; }' },
        ]);
        assert.equal(results[0]!.status, 'timeout');
        assert.deepEqual(results.slice(1).map((r) => r.output), [1, 2, 3]);
        assert.ok(stats.workersKilled >= 1);
      });

      if (setup === 'vite') {
        test('measures: median warm-pool latency of slugify over 300 calls, and worker replacement', async () => {
          const inputs = ['Hello World!', 'Rust & Wasm', '  Crucible: Forged Tools, Safely  ', 'a-b-c'].map((text) => ({ text }));
          await callInPage(tab.page, 'sandboxStart', { poolSize: 2, timeoutMs: 5000, memoryMB: 128 });
          const bench = await callInPage<{ meanMs: number; crossOriginIsolated: boolean; medianMs: number; p90Ms: number; minMs: number; failures: number; sample: unknown }>(tab.page, 'sandboxBench', {
            code: SLUGIFY,
            inputs,
            n: 300,
            warmup: 30,
          });
          assert.equal(bench.failures, 0);
          assert.deepEqual(bench.sample, { slug: 'hello-world' });
          console.log(`# chromium sandbox slugify (warm pool of 2, 300 calls): median ${bench.medianMs.toFixed(3)} ms, p90 ${bench.p90Ms.toFixed(3)} ms, min ${bench.minMs.toFixed(3)} ms, mean ${bench.meanMs.toFixed(3)} ms (performance.now() is coarsened to 0.1 ms in a page that is not cross-origin isolated: crossOriginIsolated=${bench.crossOriginIsolated})`);
          const replace = await callInPage<{ replacementMedianMs: number; nextCallMedianMs: number; replacement: number[] }>(tab.page, 'sandboxReplaceTimes', { rounds: 5, timeoutMs: 300 });
          console.log(
            `# chromium worker replacement after a kill (5 rounds): median ${replace.replacementMedianMs.toFixed(1)} ms until the new worker is ready ` +
              `[${replace.replacement.map((x) => x.toFixed(1)).join(', ')}]; median ${replace.nextCallMedianMs.toFixed(1)} ms from the timeout result to the next call's result (1-worker pool)`,
          );
          // Leave the case sandbox as it was for anything that runs later.
          await callInPage(tab.page, 'sandboxStart', { ...CASE_OPTIONS, maxFetchBodyBytes: 1024 * 1024 });
        });
      }

      if (setup === 'import map') {
        test('in a SharedWorker, which cannot start Workers, createSandbox says so rather than failing every execution later', async () => {
          const answer = await tab.page.evaluate(
            () =>
              new Promise<string>((resolve) => {
                const shared = new SharedWorker('/shared/worker.js', { type: 'module' });
                shared.port.onmessage = (event) => resolve(String(event.data));
                shared.port.start();
              }),
          );
          assert.match(answer, /^SandboxError: this context cannot start Workers/);
        });

        test('a worker script that does not load fails createSandbox fast with a clear reason', async () => {
          const r = await callInPage<{ failed: boolean; name: string; cause: string; ms: number }>(tab.page, 'sandboxStartError', { workerUrl: '/missing/worker.js', poolSize: 1 });
          assert.equal(r.failed, true);
          assert.equal(r.name, 'SandboxError');
          assert.match(r.cause, /failed to load or run \(\/missing\/worker\.js\)/);
          assert.ok(r.ms < 5000, `${r.ms} ms`);
        });

        test('a worker that never reports ready fails createSandbox at startTimeoutMs instead of hanging', async () => {
          const r = await callInPage<{ failed: boolean; cause: string; ms: number }>(tab.page, 'sandboxStartError', { workerUrl: 'data:text/javascript,', poolSize: 1, startTimeoutMs: 1500 });
          assert.equal(r.failed, true);
          assert.match(r.cause, /did not start within 1500 ms/);
          assert.ok(r.ms >= 1400 && r.ms < 4000, `${r.ms} ms`);
        });

        test('closing a sandbox while its Workers start leaves no start timer behind (a browser fires no exit event for a terminated Worker)', async () => {
          const left = await callInPage<number>(tab.page, 'startTimersLeftByClose', 987_654);
          assert.equal(left, 0, 'a pending start timer holds the dead Worker, its listeners and its slot until it fires');
        });

        test('replacements that keep failing stop respawning and fail requests instead of queueing them for ever, until retryStartAfterMs has passed', async () => {
          await callInPage(tab.page, 'sandboxStart', { poolSize: 1, timeoutMs: 300, workerUrl: '/flaky/worker.js', retryStartAfterMs: 2000 });
          const ok = await callInPage<RunOutcome>(tab.page, 'sandboxRun', { code: 'function execute(){ return 1; }' });
          assert.equal(ok.result.output, 1);
          delete flaky['/flaky/worker.js'];
          const killed = await callInPage<RunOutcome>(tab.page, 'sandboxRun', { code: 'function execute(){ for(;;){} }' });
          assert.equal(killed.result.status, 'timeout');
          const started = Date.now();
          const next = await callInPage<RunOutcome>(tab.page, 'sandboxRun', { code: 'function execute(){ return 1; }' });
          assert.equal(next.result.status, 'error', JSON.stringify(next.result));
          assert.equal(next.result.error?.code, 'worker_start');
          assert.match(next.result.error!.message, /keep failing to start/);
          assert.ok(Date.now() - started < 10_000);
          const later = await callInPage<RunOutcome>(tab.page, 'sandboxRun', { code: 'function execute(){ return 1; }' });
          assert.equal(later.result.error?.code, 'worker_start', 'fails at once, no respawn loop');
          assert.ok(later.stats.workersStarted <= 5, `workers started: ${later.stats.workersStarted}`);
          // Whatever kept the Workers from starting has passed: after retryStartAfterMs the
          // next execution starts one again, and the sandbox serves without being recreated.
          flaky['/flaky/worker.js'] = FLAKY_WORKER;
          await new Promise((resolve) => setTimeout(resolve, 2100));
          const mended = await callInPage<RunOutcome>(tab.page, 'sandboxRun', { code: 'function execute(){ return 1; }' });
          assert.equal(mended.result.output, 1, JSON.stringify(mended.result));
          assert.equal(mended.stats.workersStarted, later.stats.workersStarted + 1, 'one start, no burst');
          await callInPage(tab.page, 'sandboxStart', { ...CASE_OPTIONS, maxFetchBodyBytes: 1024 * 1024 });
        });
      }

      test('the page stayed clean (no page errors, no failed asset loads)', () => {
        // Refused fetches never leave the page; the redirect responses are opaque, not failures.
        const problems = [...tab.pageErrors, ...tab.consoleErrors, ...tab.failedRequests.filter((r) => !r.includes(`:${ctx.port}/`) && !/\/(missing|flaky)\/worker\.js/.test(r))].filter(
          (e) => !/status of 404/.test(e),
        );
        assert.deepEqual(problems, [], tab.log.join('\n'));
      });
    });
  }
});

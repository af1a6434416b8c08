/**
 * Adversarial tests of the sandbox host in Node. They load the built wasm from `npm/wasm/`:
 * run `npm run build:wasm` (or `node scripts/build-wasm.mjs --only crucible_sandbox`) first.
 * Every case asserts containment: the expected status, no host object or secret reached, the
 * call ended within the deadline + 100 ms, the next execution succeeds, host heap unaffected.
 */
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import { after, before, describe, test } from 'node:test';

import ipaddr from 'ipaddr.js';

import { SandboxError } from '../src/errors.js';
import { createSandbox, FetchRefused, sandboxLimits, type Sandbox } from '../src/sandbox/index.js';
import { bridgedFetch } from '../src/sandbox/fetch-bridge.js';
import { guardedFetch, guardedLookup } from '../src/sandbox/guarded-fetch.js';
import { codeOf, MAX_HOST_FETCHES_PER_EXECUTION } from '../src/sandbox/pool.js';
import { listenOnLoopback, startFetchServer } from './support/fetch-target-server.js';
import { CASE_OPTIONS, PROBE, PROBE_OUTPUT, RUNS_UNTIL_THE_DEADLINE, SANDBOX_CASES, type CaseContext } from './support/sandbox-cases.js';

const wasmBuilt = existsSync(new URL('../wasm/crucible_sandbox_bg.wasm', import.meta.url));
const HOST_SECRET = 'host-secret-7f3a';
(globalThis as Record<string, unknown>).HOST_SECRET = HOST_SECRET;

let server: Server | undefined;
let ctx: CaseContext;
const hostsSeen: string[] = [];

// Options are checked before the wasm is loaded, so these run without a build.
describe('createSandbox options are checked with a SandboxError', () => {
  async function refused(options: unknown, pattern: RegExp): Promise<void> {
    await assert.rejects((createSandbox as (o?: unknown) => Promise<Sandbox>)(options), (e: unknown) => {
      assert.ok(e instanceof SandboxError, `expected a SandboxError, got ${String(e)}`);
      assert.equal(e.code, 'sandbox_error');
      assert.match(e.message, pattern);
      return true;
    });
  }

  test('null or a non-object is refused, not read as options', async () => {
    await refused(null, /createSandbox takes an options object.*got null/);
    await refused(5000, /createSandbox takes an options object.*got number/);
    await refused([], /createSandbox takes an options object.*got an array/);
  });

  test('fetchDomainAllowlist must be an array of host names; a string is not split into characters', async () => {
    await refused({ fetchDomainAllowlist: 'api.example.com' }, /fetchDomainAllowlist must be an array of host names.*got "api\.example\.com"/);
    await refused({ fetchDomainAllowlist: ['api.example.com', 42] }, /fetchDomainAllowlist must be an array of host names.*non-string or empty entry/);
    await refused({ fetchDomainAllowlist: [''] }, /fetchDomainAllowlist must be an array of host names/);
    await refused({ fetchDomainAllowlist: { host: 'api.example.com' } }, /fetchDomainAllowlist must be an array of host names.*got object/);
    // A hole is no host name either: every() skips holes, and a TypeError followed.
    // eslint-disable-next-line no-sparse-arrays
    await refused({ fetchDomainAllowlist: [, 'api.example.com'] }, /fetchDomainAllowlist must be an array of host names.*non-string or empty entry/);
  });

  test('a fetchDomainAllowlist entry that is no host name is refused, not read as another host or left to throw later', async () => {
    // 'https://api.example.com' read as a host is the host `https` (a name the host's DNS
    // search domains may resolve), and api.example.com itself stays refused; a path does not
    // narrow the entry to it; `*` is no wildcard; an unparsable entry threw a bare TypeError
    // ("Invalid URL") out of createSandbox in Node and from every fetch elsewhere.
    for (const entry of ['https://api.example.com', 'api.example.com/v1', '*.example.com', 'user@api.example.com', '@api.example.com', 'api.example.com?x', 'exa mple.com', 'api.example.com:99999']) {
      await refused({ fetchDomainAllowlist: ['ok.example.com', entry] }, new RegExp(`fetchDomainAllowlist entry ${JSON.stringify(entry).replace(/[.*?]/g, '\\$&')} is not a host name`));
    }
    for (const entry of ['api.example.com', 'API.Example.com', 'localhost:8080', '127.0.0.1:8080', '[::1]:8080', 'xn--bcher-kva.example']) {
      assert.deepEqual(sandboxLimits({ fetchDomainAllowlist: [entry] }).fetchDomainAllowlist, [entry]);
    }
  });

  test('a wasm location of the caller that does not load is named as theirs, without the build hint meant for the package', async () => {
    const missing = new URL('./no-such-sandbox.wasm', import.meta.url);
    await assert.rejects(createSandbox({ wasm: missing }), (e: unknown) => e instanceof SandboxError && e.message.startsWith('cannot load the sandbox wasm from the `wasm` option: ') && !e.message.includes('build:wasm') && /no-such-sandbox/.test(e.message) && /no-such-sandbox/.test(String((e.cause as Error)?.message)));
  });

  test('a timeout that is not a usable number of milliseconds is refused', async () => {
    for (const timeoutMs of [Number.NaN, Infinity, 0, -1, '5000', 2 ** 31]) await refused({ timeoutMs }, /timeoutMs must be a positive number of milliseconds/);
    await refused({ memoryMB: '64' }, /memoryMB must be between 32 and 4096/);
    for (const maxQueued of [-1, 1.5, '8']) await refused({ maxQueued }, /maxQueued must be a whole number/);
  });

  test('fetch options that are not what they say are refused by name: a body cap the host would not hold, a string for allowHttp', async () => {
    // Infinity went to the engine as JSON null (its own 4 MiB) while the host read an endless body.
    for (const maxFetchBodyBytes of [Infinity, Number.NaN, -1, 0, 1.5, '1000', 2 ** 33]) {
      await refused({ maxFetchBodyBytes }, /maxFetchBodyBytes must be a whole number of bytes from 1 to 2147483647/);
    }
    for (const allowHttp of ['false', 1, null]) await refused({ allowHttp }, /allowHttp must be true or false/);
    assert.equal(sandboxLimits({ allowHttp: true, maxFetchBodyBytes: 1024 }).maxFetchBodyBytes, 1024);
  });
});

describe('sandbox (Node)', { skip: wasmBuilt ? false : 'npm/wasm/crucible_sandbox_bg.wasm missing: run npm run build:wasm' }, () => {
  let sandbox: Sandbox;

  before(async () => {
    ({ server, ctx } = await startFetchServer(hostsSeen));
    sandbox = await createSandbox({ ...CASE_OPTIONS, maxFetchBodyBytes: 1024 * 1024 });
  });

  after(async () => {
    await sandbox?.close();
    server?.close();
  });

  test('the public API runs sync and async execute with input, logs and duration', async () => {
    const r = await sandbox.execute({ code: 'async function execute(input) { console.log("hi", input.n); return { n: input.n + 1 }; }', input: { n: 1 } });
    assert.equal(r.status, 'ok');
    assert.deepEqual(r.output, { n: 2 });
    assert.deepEqual(r.logs, ['hi 1']);
    assert.ok(r.durationMs > 0);
    const c = await sandbox.execute({ code: 'function execute(){ return crypto.sha256("abc"); }', allowlist: ['crypto'] });
    assert.equal(c.output, 'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad');
  });

  test('code reaching a fault inside the engine (Boa slicing a buffer its arguments shrink) fails as a trap the engine owns, and the next execution runs', async () => {
    const r = await sandbox.execute({
      code: 'function execute(){ const b = new ArrayBuffer(4096, { maxByteLength: 4096 }); return b.slice({ valueOf(){ b.resize(16); return 0; } }, 4096).byteLength; }',
    });
    // The engine may be fixed to answer as the spec says (a RangeError, or a shorter copy).
    if (r.status !== 'ok' && r.error?.code !== 'runtime_error') {
      assert.equal(r.error?.code, 'trap', JSON.stringify(r));
      assert.match(r.error!.message, /JavaScript engine failed on this code .*internal error of the engine/);
    }
    const next = await sandbox.execute({ code: 'function execute(i){ return i + 1; }', input: 1 });
    assert.equal(next.output, 2);
  });

  test('text cut inside an emoji (a lone UTF-16 surrogate) in the input arrives as U+FFFD, and the tool runs', async () => {
    const r = await sandbox.execute({ code: 'function execute(input) { return { text: input.text + "!", key: Object.keys(input.tags)[0] }; }', input: { text: 'Hi ' + '🌍'.slice(0, 1), tags: { ['🌍'.slice(1)]: 1 } } });
    assert.equal(r.status, 'ok', JSON.stringify(r));
    assert.deepEqual(r.output, { text: 'Hi \ufffd!', key: '\ufffd' });
  });

  for (const c of SANDBOX_CASES) {
    test(`[${c.category}] ${c.name}`, async () => {
      const heapBefore = process.memoryUsage().heapUsed;
      const started = performance.now();
      const r = await sandbox.execute(c.request(ctx));
      const wall = performance.now() - started;
      const statuses = Array.isArray(c.status) ? c.status : [c.status];
      assert.ok(statuses.includes(r.status), `status ${r.status} not in ${statuses.join('|')}: ${JSON.stringify(r)}`);
      if (c.code) {
        const codes = Array.isArray(c.code) ? c.code : [c.code];
        assert.ok(codes.includes(r.error?.code ?? ''), `code ${r.error?.code} not in ${codes.join('|')}: ${JSON.stringify(r)}`);
      }
      c.check?.(r, ctx);
      const text = JSON.stringify(r);
      assert.ok(!text.includes(HOST_SECRET), 'a host secret reached the result');
      assert.ok(wall <= CASE_OPTIONS.timeoutMs + 100, `took ${wall.toFixed(0)} ms`);
      const probe = await sandbox.execute(PROBE);
      assert.equal(probe.status, 'ok', JSON.stringify(probe));
      assert.deepEqual(probe.output, PROBE_OUTPUT);
      const heapGrowth = process.memoryUsage().heapUsed - heapBefore;
      assert.ok(heapGrowth < 32 * 1024 * 1024, `host heap grew by ${(heapGrowth / 1048576).toFixed(1)} MB`);
    });
  }

  test("one tool cannot hook an intrinsic to read the next tool's input in the same Worker", async () => {
    const one = await createSandbox({ poolSize: 1 });
    try {
      const planter = readFileSync(new URL('../../tests/fixtures/hook-planter.js', import.meta.url), 'utf8');
      const victim = 'function execute(input){ return Object.keys(input).filter((k) => Object.prototype.hasOwnProperty.call(input, k)); }';
      assert.deepEqual((await one.execute({ code: planter, input: 'plant' })).output, { planted: false, frozen: true });
      assert.deepEqual((await one.execute({ code: victim, input: { apiKey: 'sk-secret' } })).output, ['apiKey']);
      assert.equal((await one.execute({ code: planter, input: 'collect' })).output, 'nothing');
    } finally {
      await one.close();
    }
  });

  test('refused fetches never reach a non-allowlisted host', () => {
    assert.ok(hostsSeen.length > 0);
    for (const host of hostsSeen) assert.equal(host, `127.0.0.1:${ctx.port}`, `request reached host '${host}'`);
  });

  test('http is refused unless allowHttp is set', async () => {
    const strict = await createSandbox({ poolSize: 1, fetchDomainAllowlist: ['127.0.0.1'] });
    try {
      const r = await strict.execute({ code: `async function execute(){ try { await fetch('${ctx.origin}/ok'); return 'fetched'; } catch (e) { return e.message; } }`, allowlist: ['fetch'] });
      assert.match(String(r.output), /scheme 'http:' is not allowed/);
    } finally {
      await strict.close();
    }
  });

  test("a guest's fetch carries no credentials of the host (cookies, HTTP auth)", async () => {
    const seen: RequestInit[] = [];
    const recording: typeof fetch = async (_url, init) => {
      seen.push(init ?? {});
      return new Response('{}', { status: 200, headers: { 'content-type': 'application/json' } });
    };
    const one = await createSandbox({ poolSize: 1, fetchDomainAllowlist: ['api.example'], fetch: recording });
    try {
      const r = await one.execute({ code: "async function execute(){ return (await fetch('https://api.example/me')).status; }", allowlist: ['fetch'] });
      assert.equal(r.output, 200, JSON.stringify(r));
      assert.deepEqual(seen.map((init) => init.credentials), ['omit']);
    } finally {
      await one.close();
    }
  });

  test('a fetch nobody awaits is harmless: neither its execution nor the next one fails', async () => {
    const one = await createSandbox({ poolSize: 1, allowHttp: true, fetchDomainAllowlist: ['127.0.0.1'] });
    try {
      // One refused at once, one that completes after the execution has ended.
      const code = `function execute(){ fetch('http://not-allowlisted.example/'); fetch('${ctx.origin}/ok'); return 1; }`;
      const [fired, next] = await Promise.all([one.execute({ code, allowlist: ['fetch'] }), one.execute({ code: 'function execute(){ return 2; }' })]);
      assert.deepEqual([fired.status, fired.output, next.status, next.output], ['ok', 1, 'ok', 2], JSON.stringify([fired, next]));
      await new Promise((resolve) => setTimeout(resolve, 200));
      assert.equal((await one.execute({ code: 'function execute(){ return 3; }' })).output, 3);
      assert.equal(one.stats().workersKilled, 0, 'no worker was lost to the unawaited fetches');
    } finally {
      await one.close();
    }
  });

  test(`the host runs at most ${MAX_HOST_FETCHES_PER_EXECUTION} fetches of one execution at once; the others wait their turn, or go with the execution`, async () => {
    // Each fetch in flight may hold a body of up to maxFetchBodyBytes on the main thread.
    let open = 0;
    let most = 0;
    const paths: string[] = [];
    const held = createServer((req, res) => {
      paths.push(req.url ?? '');
      open++;
      most = Math.max(most, open);
      res.on('close', () => open--);
      if (req.url !== '/hang') setTimeout(() => res.end(req.url), 50);
    });
    const { origin } = await listenOnLoopback(held);
    const one = await createSandbox({ poolSize: 1, timeoutMs: 10_000, allowHttp: true, fetchDomainAllowlist: ['127.0.0.1'] });
    try {
      const sixteen = 'Array.from({ length: 16 }, (_, k) => fetch(i.origin + (i.hang ? "/hang" : "/n" + k)).then((r) => r.text()))';
      const all = await one.execute({ code: `async function execute(i){ return Promise.all(${sixteen}); }`, input: { origin }, allowlist: ['fetch'] });
      assert.deepEqual(all.output, Array.from({ length: 16 }, (_, k) => `/n${k}`), JSON.stringify(all));
      assert.equal(most, MAX_HOST_FETCHES_PER_EXECUTION);
      // 16 that never answer, left behind: the first ones are aborted when the execution ends
      // (it spins 300 ms first, so they reach the server), the waiting ones are never sent.
      paths.length = 0;
      const spin = 'const t = Date.now(); while (Date.now() < t + 300);';
      const left = await one.execute({ code: `function execute(i){ ${sixteen}; ${spin} return 'left'; }`, input: { origin, hang: true }, allowlist: ['fetch'] });
      assert.equal(left.output, 'left', JSON.stringify(left));
      await new Promise((resolve) => setTimeout(resolve, 300));
      assert.deepEqual([paths.length, open], [MAX_HOST_FETCHES_PER_EXECUTION, 0]);
      assert.equal((await one.execute({ code: 'function execute(){ return 3; }' })).output, 3);
    } finally {
      await one.close();
      held.closeAllConnections();
      held.close();
    }
  });

  test('memory some engine state keeps after an execution does not fail later executions', async () => {
    // Symbol.for keys live in the engine's global registry, which no execution frees. Reused
    // as is, the worker failed the 4th of these with `memory`; replaced once it has grown past
    // half its budget, none fails.
    const one = await createSandbox({ poolSize: 1, memoryMB: 64 });
    try {
      for (let i = 0; i < 6; i++) {
        const r = await one.execute({ code: `function execute(){ Symbol.for('k${i}' + 'x'.repeat(1e6)); return ${i}; }` });
        assert.deepEqual([r.status, r.output], ['ok', i], JSON.stringify(r));
      }
      const stats = one.stats();
      assert.ok(stats.workersRecycled >= 1, JSON.stringify(stats));
      assert.equal(stats.workersKilled, 0);
    } finally {
      await one.close();
    }
  });

  test('a reused worker shows no trace of a previous execution', async () => {
    const one = await createSandbox({ poolSize: 1 });
    try {
      const polluter = await one.execute({
        code: "let leaked = 1; function execute(){ for (const f of [() => { Object.prototype.p = 1; }, () => { Array.prototype.push = null; }, () => { String.prototype.trim = () => 'x'; }]) { try { f(); } catch {} } const again = () => Promise.resolve().then(() => { console.log('leftover'); again(); }); again(); return 1; }",
      });
      assert.equal(polluter.status, 'ok');
      const probe = await one.execute({ code: 'function execute(){ const a = []; a.push(1); return [typeof leaked, ({}).p, a.length, " y ".trim()]; }' });
      // `({}).p` is undefined, which JSON renders as null inside an array.
      assert.deepEqual(probe.output, ['undefined', null, 1, 'y']);
      assert.deepEqual(probe.logs, []);
    } finally {
      await one.close();
    }
  });

  test('source nested past the validator\'s count is rejected as too_deep before parsing, and chains just under it run in the instance\'s stack', async () => {
    // A quote in a regex literal once hid the brackets after it from the count, and chains of
    // operators, keywords or labels were not counted: the parser ran out of stack and the
    // Worker was replaced (`stack_overflow`).
    const one = await createSandbox({ poolSize: 1 });
    try {
      for (const body of [`var r = /'/; var x = ${'('.repeat(3000)}1${')'.repeat(3000)};`, `async function f(){ for await (const x of []) /'/; var x = ${'('.repeat(3000)}1${')'.repeat(3000)}; }`, `var x = ${'void '.repeat(3000)}1;`, `var b; b = ${'b='.repeat(3000)}1;`, `${'l:'.repeat(3000)}1;`]) {
        const r = await one.execute({ code: `function execute(){ return 1; }\n${body}` });
        assert.deepEqual([r.status, r.error?.code], ['rejected', 'too_deep'], JSON.stringify(r).slice(0, 300));
      }
      // The limits (64 brackets; 256 operators, keywords and brackets in one expression) leave
      // the parser room on V8's stack and the instance's, each kind just under them.
      const deep = `${'('.repeat(60)}a${')'.repeat(60)}`;
      for (const chain of [`${'b='.repeat(190)}${deep}`, `${'a**'.repeat(95)}${deep}`, `${'new '.repeat(125)}F`, `${'typeof '.repeat(190)}${deep}`]) {
        const r = await one.execute({ code: `function execute(){ var a = 1, b; function F(){} return ${chain}; }` });
        assert.ok(r.status === 'ok' || r.error?.code === 'runtime_error', JSON.stringify(r).slice(0, 300));
      }
      // A lookup written as a `?:` chain of comparisons: each `===` counted 3 once, and 60
      // branches were refused; it counts as one operator, like the `+` it nests no deeper than.
      const lookup = Array.from({ length: 80 }, (_, k) => `n === ${k} ? 'v${k}' : `).join('');
      const looked = await one.execute({ code: `function execute(n){ return ${lookup}'none'; }`, input: 79 });
      assert.equal(looked.output, 'v79', JSON.stringify(looked).slice(0, 300));
      for (const chain of [`${'a==='.repeat(190)}${deep}`, `${'a&&'.repeat(190)}${deep}`]) {
        const r = await one.execute({ code: `function execute(){ var a = 1; return ${chain}; }` });
        assert.equal(r.status, 'ok', JSON.stringify(r).slice(0, 300));
      }
      const labels = await one.execute({ code: `function execute(){ ${'if(1)'.repeat(30)} ${Array.from({ length: 100 }, (_, k) => `l${k}:`).join('')} return 1; }` });
      assert.equal(labels.status, 'ok', JSON.stringify(labels).slice(0, 300));
      assert.equal(one.stats().workersKilled, 0, 'no Worker was replaced');
      assert.equal((await one.execute({ code: 'function execute(i){ return i + 1; }', input: 1 })).output, 2);
    } finally {
      await one.close();
    }
    // A stack that runs out anyway (V8's or the instance's own, which traps as an out-of-bounds
    // access) still ends as stack_overflow: played by a test double Worker that reports exactly it.
    const trapping = `import { parentPort } from 'node:worker_threads';
      parentPort.on('message', (m) => {
        if (m.type === 'init') parentPort.postMessage({ type: 'ready' });
        if (m.type === 'execute') parentPort.postMessage({ type: 'trap', id: m.id, message: 'RuntimeError: memory access out of bounds', allocationFailed: false, memoryBytes: 24 << 20 });
      });`;
    const double = await createSandbox({ poolSize: 1, workerUrl: new URL(`data:text/javascript,${encodeURIComponent(trapping)}`) });
    try {
      const r = await double.execute({ code: 'function execute(){ return 1; }' });
      assert.deepEqual([r.status, r.error?.code], ['error', 'stack_overflow'], JSON.stringify(r));
    } finally {
      await double.close();
    }
  });

  test('a division the validator could take for a regex (after `}`, `of`, `yield`, `await`) hides no brackets from it, and such code runs', async () => {
    // Read as a regex, each `/` here skipped the brackets up to the next `/`: the parser ran out
    // of stack and the Worker was replaced (`stack_overflow`).
    const one = await createSandbox({ poolSize: 1 });
    try {
      const deep = `${'('.repeat(3000)}1${')'.repeat(3000)}`;
      for (const body of [
        `var f = function(){} / 2 + ${deep} / 3;`,
        `var f = class {} / 2 + ${deep} / 3;`,
        `var f = 1 ? 1 : {} / 2 + ${deep} / 3;`,
        `var of = 1; var x = of / 2 + ${deep} / 3;`,
        `var yield = 1; var x = yield / 2 + '/' + ${deep};`,
        `var await = 1; var x = await / 2 + ${deep} / 3;`,
      ]) {
        const r = await one.execute({ code: `function execute(){ return 1; }\n${body}` });
        assert.deepEqual([r.status, r.error?.code], ['rejected', 'too_deep'], `${body.slice(0, 40)}: ${JSON.stringify(r).slice(0, 300)}`);
      }
      const r = await one.execute({
        code: `function execute(i) {
          var of = i.n, r = [];
          for (const m of /a(b)/g.exec('xab')) r.push(m);
          function* g() { yield /'[)(]/.source; }
          if (of) { r.push(of / 2) }
          /x/.test('x') && r.push(g().next().value);
          const f = function () { return 4; } / 2;
          return [r, of / 4, isNaN(f)];
        }`,
        input: { n: 8 },
      });
      assert.deepEqual(r.output, [['ab', 'b', 4, "'[)(]"], 2, true], JSON.stringify(r).slice(0, 300));
      assert.equal(one.stats().workersKilled, 0, 'no Worker was replaced');
    } finally {
      await one.close();
    }
  });

  test('a worker that never becomes ready fails createSandbox promptly instead of hanging', async () => {
    for (const workerUrl of [new URL('data:text/javascript,'), new URL('data:text/javascript,setInterval(()=>{},1000)')]) {
      const started = performance.now();
      await assert.rejects(createSandbox({ poolSize: 1, workerUrl, startTimeoutMs: 1000 }), (e: Error & { cause?: Error }) => {
        assert.equal(e.name, 'SandboxError');
        assert.match(String(e.cause?.message), /exited with code|did not start within 1000 ms/);
        return true;
      });
      assert.ok(performance.now() - started < 3000);
    }
  });

  test('a lazy sandbox starts its Workers with the first execution, which waits for them', async () => {
    const lazy = await createSandbox({ ...CASE_OPTIONS, lazy: true });
    try {
      assert.equal(lazy.stats().workersStarted, 0, 'createSandbox started nothing');
      const results = await Promise.all([1, 2, 3].map((n) => lazy.execute({ code: 'function execute(i){ return i * 2; }', input: n })));
      assert.deepEqual(results.map((r) => r.output), [2, 4, 6]);
      assert.equal(lazy.stats().workersStarted, CASE_OPTIONS.poolSize, 'one start for the pool, not one per execution');
    } finally {
      await lazy.close();
    }
    await assert.rejects(createSandbox({ lazy: 'yes' as never }), { name: 'SandboxError', message: /lazy must be true or false/ });
    for (const bad of [-1, Number.NaN, -Infinity, '30000']) {
      await assert.rejects(createSandbox({ retryStartAfterMs: bad as never, lazy: true }), { name: 'SandboxError', message: /retryStartAfterMs must be a number of milliseconds/ }, String(bad));
    }
    for (const bad of [0, -1, Number.NaN, 2 ** 31, '20000']) {
      await assert.rejects(createSandbox({ startTimeoutMs: bad as never, lazy: true }), { name: 'SandboxError', message: /startTimeoutMs must be a positive number of milliseconds/ }, String(bad));
    }
  });

  test('a lazy sandbox whose Workers cannot start fails the executions waiting for them at the first failure, and the next one tries again', async () => {
    for (const workerUrl of ['data:text/javascript,', 'data:text/javascript,setInterval(()=>{},1000)', 'no such scheme']) {
      const lazy = await createSandbox({ poolSize: 1, workerUrl, startTimeoutMs: 300, lazy: true });
      try {
        const started = performance.now();
        const result = await lazy.execute({ code: 'function execute(){ return 1; }' });
        assert.equal(result.status, 'error', workerUrl);
        assert.equal(result.error?.code, 'worker_start', JSON.stringify(result));
        assert.ok(performance.now() - started < 3000, `${workerUrl}: gave up after ${performance.now() - started} ms`);
        // As an eager start fails createSandbox at once: no respawns (each waiting out startTimeoutMs) first.
        const startedOnce = lazy.stats().workersStarted;
        assert.ok(startedOnce <= 1, `${workerUrl}: ${startedOnce} Workers started for one execution`);
        assert.equal((await lazy.execute({ code: 'function execute(){ return 1; }' })).error?.code, 'worker_start', 'the next execution fails too');
        // It tried again (a Worker that cannot even be created counts no start).
        if (workerUrl !== 'no such scheme') assert.equal(lazy.stats().workersStarted, startedOnce + 1, 'the next execution starts afresh');
      } finally {
        await lazy.close();
      }
    }
  });

  /**
   * A test double Worker: whether it starts is read from the environment it was created with
   * (Node copies it into each Worker): `yes`, `no`, or a file's path (it fails to start if it
   * is the one that deletes that file: one transient failure). An execution answers after
   * 100 ms with its thread's id, or never for 'hang'.
   */
  const startGatedWorker = new URL(
    `data:text/javascript,${encodeURIComponent(`import { parentPort, threadId } from 'node:worker_threads';
      import { unlinkSync } from 'node:fs';
      const gate = process.env.CRUCIBLE_TEST_WORKER_STARTS;
      const deletes = (path) => { try { unlinkSync(path); return true; } catch { return false; } };
      parentPort.on('message', (m) => {
        const starts = gate === 'yes' || (gate !== 'no' && !deletes(gate));
        if (m.type === 'init') parentPort.postMessage(starts ? { type: 'ready' } : { type: 'init-error', message: 'not now' });
        if (m.type === 'execute' && !m.request.includes('hang')) {
          setTimeout(() => parentPort.postMessage({ type: 'result', id: m.id, result: JSON.stringify({ status: 'ok', output: threadId, logs: [] }) }), 100);
        }
      });`)}`,
  );

  /** A sandbox of two start-gated Workers with one position given up (three failed starts in a
   *  row) while the other Worker serves; `served()` counts the Workers serving two executions. */
  async function poolWithAPositionGivenUp(retryStartAfterMs: number) {
    process.env.CRUCIBLE_TEST_WORKER_STARTS = 'yes';
    const box = await createSandbox({ poolSize: 2, timeoutMs: 200, retryStartAfterMs, workerUrl: startGatedWorker });
    const served = async () => new Set((await Promise.all([1, 2].map(() => box.execute({ code: 'function execute(){}' })))).map((r) => r.output)).size;
    assert.equal(await served(), 2, 'two Workers serve two executions at once');
    // One Worker is killed at its deadline, and its replacement fails three starts in a row:
    // that position is given up while the other Worker goes on serving.
    process.env.CRUCIBLE_TEST_WORKER_STARTS = 'no';
    assert.equal((await box.execute({ code: 'function execute(){} // hang' })).status, 'timeout');
    while (box.stats().workersStarted < 5) await new Promise((resolve) => setTimeout(resolve, 10));
    await new Promise((resolve) => setTimeout(resolve, 50));
    assert.equal(box.stats().workersStarted, 5, 'no respawn loop');
    assert.equal(await served(), 1, 'one Worker left');
    /** Until the pool serves with two Workers again (a loaded machine may take a while to
     *  start one): at most 20 tries, none begun past `withinMs`. */
    const servedWhole = async (withinMs = Infinity) => {
      const started = performance.now();
      let serving = await served();
      for (let tries = 0; serving < 2 && tries < 20 && performance.now() - started < withinMs; tries++) serving = await served();
      return serving;
    };
    return { box, served, servedWhole };
  }

  test('a pool position whose Worker kept failing to start while another Worker served is filled again after retryStartAfterMs', async () => {
    const { box, servedWhole } = await poolWithAPositionGivenUp(300);
    try {
      // What kept it from starting passed: after retryStartAfterMs an execution starts it again.
      process.env.CRUCIBLE_TEST_WORKER_STARTS = 'yes';
      await new Promise((resolve) => setTimeout(resolve, 300));
      await box.execute({ code: 'function execute(){}' });
      assert.equal(box.stats().workersStarted, 6, 'one start for the one empty position');
      assert.equal(await servedWhole(), 2, 'the pool is whole again');
      assert.equal(box.stats().workersStarted, 6);
    } finally {
      delete process.env.CRUCIBLE_TEST_WORKER_STARTS;
      await box.close();
    }
  });

  test('a position started again after retryStartAfterMs has its own three starts: one transient failure is replaced, not given up again', async () => {
    // A long period: the pool must be whole again well before another retry could mend it.
    const retryStartAfterMs = 2000;
    const { box, servedWhole } = await poolWithAPositionGivenUp(retryStartAfterMs);
    const { mkdtempSync, writeFileSync, rmSync } = await import('node:fs');
    const { tmpdir } = await import('node:os');
    const { join } = await import('node:path');
    const dir = mkdtempSync(join(tmpdir(), 'crucible-start-gate-'));
    try {
      // The retry's first Worker fails to start (it deletes the file); the next one starts.
      const once = join(dir, 'fail-once');
      writeFileSync(once, '');
      process.env.CRUCIBLE_TEST_WORKER_STARTS = once;
      await new Promise((resolve) => setTimeout(resolve, retryStartAfterMs));
      await box.execute({ code: 'function execute(){}' });
      assert.equal(await servedWhole(retryStartAfterMs / 2), 2, 'the pool is whole again, without waiting for another retry');
      assert.equal(box.stats().workersStarted, 7, 'the failed start, then its replacement');
    } finally {
      delete process.env.CRUCIBLE_TEST_WORKER_STARTS;
      rmSync(dir, { recursive: true, force: true });
      await box.close();
    }
  });

  test('retryStartAfterMs: Infinity leaves a position given up empty for good', async () => {
    const { box, served } = await poolWithAPositionGivenUp(Infinity);
    try {
      process.env.CRUCIBLE_TEST_WORKER_STARTS = 'yes';
      await new Promise((resolve) => setTimeout(resolve, 100));
      assert.equal(await served(), 1, 'still one Worker');
      assert.equal(box.stats().workersStarted, 5, 'no start was tried again');
    } finally {
      delete process.env.CRUCIBLE_TEST_WORKER_STARTS;
      await box.close();
    }
  });

  test('a position whose Worker kept failing to start does not give up a pool whose other Worker was only retired for idleness', async () => {
    process.env.CRUCIBLE_TEST_WORKER_STARTS = 'yes';
    const box = await createSandbox({ poolSize: 2, lazy: true, idleTimeoutMs: 300, timeoutMs: 1000, retryStartAfterMs: Infinity, workerUrl: startGatedWorker });
    try {
      await Promise.all([1, 2].map(() => box.execute({ code: 'function execute(){}' })));
      // One Worker runs code that hangs while the other is retired; the hung one is killed at
      // its deadline and its position then fails three starts in a row.
      const hung = box.execute({ code: 'function execute(){} // hang' });
      process.env.CRUCIBLE_TEST_WORKER_STARTS = 'no';
      assert.equal((await hung).status, 'timeout');
      assert.equal(box.stats().workersRetired, 1, 'the other Worker was retired meanwhile');
      while (box.stats().workersStarted < 5) await new Promise((resolve) => setTimeout(resolve, 10));
      await new Promise((resolve) => setTimeout(resolve, 50));
      process.env.CRUCIBLE_TEST_WORKER_STARTS = 'yes';
      const result = await box.execute({ code: 'function execute(){}' });
      assert.equal(result.status, 'ok', `the retired position starts again and serves: ${JSON.stringify(result.error)}`);
    } finally {
      delete process.env.CRUCIBLE_TEST_WORKER_STARTS;
      await box.close();
    }
  });

  test('a lazy sandbox counts the Workers it has yet to start as free: maxQueued bounds only executions that must wait', async () => {
    const lazy = await createSandbox({ ...CASE_OPTIONS, poolSize: 2, maxQueued: 0, lazy: true });
    try {
      const code = 'function execute(i){ return i * 2; }';
      const results = await Promise.all([1, 2, 3].map((n) => lazy.execute({ code, input: n })));
      assert.deepEqual(results.map((r) => r.output ?? r.error?.code), [2, 4, 'queue_full'], 'two Workers take two, and none may wait');
      assert.equal((await lazy.execute({ code, input: 5 })).output, 10, 'and it keeps serving');
    } finally {
      await lazy.close();
    }
  });

  test('close() resolves once its Workers have exited (a busy one, and one replaced just before with its replacement starting): none is left among the active handles', async () => {
    // A Worker thread holds ~26 MB; a service closing agents, or its leak check after
    // `await close()`, must find them gone, not still terminating. Node lists a Worker that
    // keeps the process alive (a busy or terminating one) as its MessagePort.
    const workerHandles = () => (process as unknown as { _getActiveHandles(): object[] })._getActiveHandles().filter((h) => h.constructor?.name === 'MessagePort').length;
    const before = workerHandles();
    const box = await createSandbox({ poolSize: 2 });
    const loop = { code: 'function execute(){ for (;;) {} }' };
    const abort = new AbortController();
    const replaced = box.execute(loop, { signal: abort.signal });
    const busy = box.execute(loop);
    await new Promise((resolve) => setTimeout(resolve, 50));
    abort.abort();
    assert.equal((await replaced).error?.code, 'aborted');
    assert.ok(workerHandles() > before, 'the busy Worker, the aborted one and its replacement are active');
    await box.close();
    assert.equal(workerHandles(), before, 'no Worker of the closed sandbox is left');
    assert.equal((await busy).error?.code, 'closed');
  });

  test('a timed-out worker is replaced and the pool keeps serving in parallel', async () => {
    const results = await Promise.all([
      sandbox.execute({ code: RUNS_UNTIL_THE_DEADLINE }),
      sandbox.execute({ code: 'function execute(){ return 1; }' }),
      sandbox.execute({ code: 'function execute(){ return 2; }' }),
      sandbox.execute({ code: 'function execute(){ return 3; }' }),
    ]);
    assert.equal(results[0]!.status, 'timeout');
    assert.deepEqual(results.slice(1).map((r) => r.output), [1, 2, 3]);
    assert.ok(sandbox.stats().workersKilled >= 1);
  });
});

describe('aborting an execution (Node)', { skip: wasmBuilt ? false : 'npm/wasm/crucible_sandbox_bg.wasm missing' }, () => {
  test('a running execution ends at once with its Worker replaced; a queued one is dropped; the pool keeps serving', async () => {
    const sandbox = await createSandbox({ poolSize: 1, timeoutMs: 20_000 });
    try {
      const running = new AbortController();
      const queued = new AbortController();
      const started = performance.now();
      const spin = sandbox.execute({ code: 'function execute(){ for(;;){} }' }, { signal: running.signal });
      const waiting = sandbox.execute({ code: 'function execute(){ return "ran"; }' }, { signal: queued.signal });
      const next = sandbox.execute({ code: 'function execute(){ return "next"; }' });
      queued.abort();
      const dropped = await waiting;
      assert.deepEqual([dropped.status, dropped.error?.code], ['error', 'aborted']);
      setTimeout(() => running.abort(), 100);
      const stopped = await spin;
      assert.deepEqual([stopped.status, stopped.error?.code], ['error', 'aborted']);
      assert.ok(performance.now() - started < 2000, 'ended by the abort, not the 20 s deadline');
      assert.equal(sandbox.stats().workersKilled, 1);
      // The job behind them runs on the replacement Worker; the dropped one never ran.
      assert.equal((await next).output, 'next');
      // An already aborted signal is refused before anything runs; aborting a finished one is a no-op.
      const late = new AbortController();
      late.abort();
      assert.equal((await sandbox.execute({ code: 'function execute(){ return 1; }' }, { signal: late.signal })).error?.code, 'aborted');
      const done = new AbortController();
      assert.equal((await sandbox.execute({ code: 'function execute(){ return 2; }' }, { signal: done.signal })).output, 2);
      done.abort();
      assert.equal(sandbox.stats().workersKilled, 1);
      // Something that is not an AbortSignal is a bad request, refused before anything runs.
      const notSignal = await sandbox.execute({ code: 'function execute(){ return 3; }' }, { signal: {} as AbortSignal });
      assert.deepEqual([notSignal.status, notSignal.error?.code], ['rejected', 'bad_request']);
      assert.equal((await sandbox.execute({ code: 'function execute(){ return 4; }' })).output, 4);
    } finally {
      await sandbox.close();
    }
  });

  test('a request that cannot be read or sent is rejected as bad_request in words, through the promise, before anything runs', async () => {
    const sandbox = await createSandbox({ poolSize: 1 });
    const code = 'function execute(input) { return input; }';
    try {
      const cases: [unknown, unknown, RegExp][] = [
        // Before: execute threw these where it was called.
        [new Proxy({}, { get: () => { throw new Error('get trap throws'); } }), undefined, /^the request could not be read: get trap throws$/],
        [{ code, input: 1 }, { get signal(): never { throw new Error('getter throws'); } }, /^the options could not be read: getter throws$/],
        // Before: status error, "request is not valid JSON: missing field `input` at line 1 column 55".
        [{ code, input: () => 1 }, undefined, /^request\.input has no JSON form/],
        [{ code, input: Symbol('s') }, undefined, /^request\.input has no JSON form/],
        // Before: status error, "invalid type: string \"fetch\", expected a sequence at line 1 column 69".
        [{ code, input: 1, allowlist: 'fetch' }, undefined, /^request\.allowlist must be an array of host API names \('fetch', 'crypto'\), got "fetch"$/],
        [{ code, input: 1, allowlist: ['fetch', 5] }, undefined, /^request\.allowlist must be an array of host API names/],
        // eslint-disable-next-line no-sparse-arrays
        [{ code, input: 1, allowlist: [, 'crypto'] }, undefined, /^request\.allowlist must be an array of host API names/],
      ];
      for (const [request, options, message] of cases) {
        let pending: Promise<unknown> | undefined;
        assert.doesNotThrow(() => void (pending = sandbox.execute(request as never, options as never)));
        const result = (await pending) as { status: string; error?: { code: string; message: string } };
        assert.deepEqual([result.status, result.error?.code], ['rejected', 'bad_request'], JSON.stringify(result));
        assert.match(result.error!.message, message);
      }
      assert.equal(sandbox.stats().workersStarted, 1, 'nothing reached a Worker that could fail it');
      assert.deepEqual((await sandbox.execute({ code, input: { a: 1 }, allowlist: null as never })).output, { a: 1 }, 'null is no allowlist, as absent');
    } finally {
      await sandbox.close();
    }
  });

  test('past maxQueued waiting executions, one more ends at once with queue_full; the waiting ones still run', async () => {
    const sandbox = await createSandbox({ poolSize: 1, maxQueued: 2, timeoutMs: 20_000 });
    try {
      const running = new AbortController();
      const spin = sandbox.execute({ code: RUNS_UNTIL_THE_DEADLINE }, { signal: running.signal });
      const waiting = [1, 2].map((n) => sandbox.execute({ code: 'function execute(input){ return input; }', input: n }));
      const started = performance.now();
      const refused = await sandbox.execute({ code: 'function execute(){ return 3; }' });
      assert.ok(performance.now() - started < 500, 'refused at once, not after the spinning execution');
      assert.equal(refused.status, 'error');
      assert.equal(refused.error?.code, 'queue_full');
      assert.match(refused.error?.message ?? '', /2 executions are already waiting.*maxQueued 2/);
      running.abort();
      assert.equal((await spin).error?.code, 'aborted');
      assert.deepEqual((await Promise.all(waiting)).map((r) => r.output), [1, 2]);
      // With the queue drained, executions are accepted again.
      assert.equal((await sandbox.execute({ code: 'function execute(){ return 4; }' })).output, 4);
    } finally {
      await sandbox.close();
    }
  });

  test('with maxQueued 0 nothing waits, not even for a Worker that is being replaced', async () => {
    const sandbox = await createSandbox({ poolSize: 1, maxQueued: 0, timeoutMs: 300 });
    try {
      const killed = sandbox.execute({ code: RUNS_UNTIL_THE_DEADLINE });
      assert.equal((await sandbox.execute({ code: 'function execute(){ return 1; }' })).error?.code, 'queue_full', 'the one Worker is busy');
      assert.equal((await killed).error?.code, 'deadline');
      // Its replacement is starting now.
      assert.equal((await sandbox.execute({ code: 'function execute(){ return 1; }' })).error?.code, 'queue_full', 'refused at once, not kept until the replacement is ready');
    } finally {
      await sandbox.close();
    }
  });

  test('a burst of executions of one code that run to the deadline does not hold another code\'s execution behind all of them', async () => {
    // What one forge of a looping tool submits: its test cases (up to 32) at once, one code.
    // Strictly first come first served, the other call waited for every one of them, deadline
    // and Worker respawn after deadline (12 here: over 6 s); Workers now go to the codes in turns.
    const timeoutMs = 500;
    const sandbox = await createSandbox({ poolSize: 1, timeoutMs });
    try {
      // Codes take turns; within one code, first come first served.
      const order: unknown[] = [];
      const run = (code: string, input: unknown) => sandbox.execute({ code, input }).then((r) => void order.push(r.output));
      const same = 'function execute(i){ return i; }';
      await Promise.all([run(same, 1), run(same, 2), run(same, 3), run('function execute(i){ return "other " + i; }', 1)]);
      assert.deepEqual(order, [1, 'other 1', 2, 3]);
      const executeJson = (sandbox as unknown as Record<symbol, (json: string) => { result: Promise<string> }>)[Symbol.for('crucible.sandbox.executeJson')]!;
      // As the agent core submits them (the JSON fast path, `code` first).
      const burst = Array.from({ length: 12 }, (_, k) => executeJson(JSON.stringify({ code: RUNS_UNTIL_THE_DEADLINE, input: { k }, allowlist: [] })).result);
      await new Promise((resolve) => setTimeout(resolve, 50));
      const started = performance.now();
      const other = await sandbox.execute({ code: 'function execute(i){ return i + 1; }', input: 41 });
      const waited = performance.now() - started;
      assert.equal(other.output, 42, JSON.stringify(other));
      assert.ok(waited < 3 * timeoutMs, `waited ${waited.toFixed(0)} ms: at most one deadline and one Worker respawn, not the whole burst`);
      await sandbox.close();
      // The rest of the burst ends with the sandbox, none left behind.
      const codes = (await Promise.all(burst)).map((text) => (JSON.parse(text) as { error?: { code: string } }).error?.code);
      assert.ok(codes.every((code) => code === 'deadline' || code === 'closed'), JSON.stringify(codes));
    } finally {
      await sandbox.close();
    }
  });

  test('agents sharing a sandbox take turns by agent: one flooding it with many codes that run to the deadline holds another agent for one deadline, and takes at most half the places', async () => {
    // One agent's model forging looping code again and again: each forge is a code of its
    // own. By code alone, the other agent's call waited behind every one of them.
    const timeoutMs = 400;
    const sandbox = await createSandbox({ poolSize: 1, timeoutMs, maxQueued: 8 });
    try {
      const executeJson = (sandbox as unknown as Record<symbol, (json: string, tenant?: string) => { result: Promise<string> }>)[Symbol.for('crucible.sandbox.executeJson')]!;
      const request = (code: string, input: unknown) => JSON.stringify({ code, input, allowlist: [] });
      const flood = Array.from({ length: 6 }, (_, k) => executeJson(request(`${RUNS_UNTIL_THE_DEADLINE} /* ${k} */`, {}), 'tenant-a').result);
      await new Promise((resolve) => setTimeout(resolve, 50));
      // Half of maxQueued (4) of agent A's wait: the fifth is refused, another agent still has room.
      const refused = JSON.parse(await flood[5]!) as { error?: { code: string; message: string } };
      assert.equal(refused.error?.code, 'queue_full', JSON.stringify(refused));
      assert.match(refused.error?.message ?? '', /this agent's 4 executions already wait .*at most half of maxQueued 8 per agent/);
      const started = performance.now();
      const other = JSON.parse(await executeJson(request('function execute(i){ return i + 1; }', 41), 'tenant-b').result) as { output?: unknown };
      const waited = performance.now() - started;
      assert.equal(other.output, 42, JSON.stringify(other));
      assert.ok(waited < 2.5 * timeoutMs, `waited ${waited.toFixed(0)} ms: one deadline and one Worker respawn, not agent A's ${flood.length - 1}`);
      await sandbox.close();
      const codes = (await Promise.all(flood.slice(0, 5))).map((text) => (JSON.parse(text) as { error?: { code: string } }).error?.code);
      assert.ok(codes.every((code) => code === 'deadline' || code === 'closed'), JSON.stringify(codes));
    } finally {
      await sandbox.close();
    }
  });

  test('the code of a request\'s JSON text is read without parsing its input', () => {
    const request = { code: 'function execute(){ return "a\\"b\\\\"; }', input: { code: 'not this one' }, allowlist: [] };
    assert.equal(codeOf(JSON.stringify(request)), JSON.stringify(request.code).slice(1, -1));
    assert.equal(codeOf(JSON.stringify({ code: 'x\\' })), 'x\\\\');
    // Another field order is parsed; text that is no request is its own key.
    assert.equal(codeOf(JSON.stringify({ input: 1, code: 'y' })), 'y');
    assert.equal(codeOf('{"code":"unterminated'), '{"code":"unterminated');
  });
});

describe('sandbox memory budget (Node)', { skip: wasmBuilt ? false : 'npm/wasm/crucible_sandbox_bg.wasm missing' }, () => {
  test('at the minimum budget (32 MB) a Worker is reused, and still replaced once it has grown a lot', async () => {
    // A fresh Worker is already past half of 32 MB (16 MiB initial memory and the engine's own),
    // so measured from zero every execution replaced its Worker: a cold start per call.
    const sandbox = await createSandbox({ poolSize: 1, memoryMB: 32 });
    try {
      for (let n = 0; n < 5; n++) assert.equal((await sandbox.execute({ code: 'function execute(i){ return i * 2; }', input: n })).output, n * 2);
      assert.deepEqual([sandbox.stats().workersStarted, sandbox.stats().workersRecycled], [1, 0], JSON.stringify(sandbox.stats()));
      // Some 60,000 objects take the instance to about 28 of its 32 MB: that Worker is replaced.
      const grown = await sandbox.execute({ code: "function execute(){ const a = []; for (let k = 0; k < 60000; k++) a.push({ k, s: 'x' + k }); return a.length; }" });
      assert.equal(grown.output, 60000, JSON.stringify(grown));
      assert.equal(sandbox.stats().workersRecycled, 1, JSON.stringify(sandbox.stats()));
      assert.equal((await sandbox.execute({ code: 'function execute(){ return 1; }' })).output, 1);
    } finally {
      await sandbox.close();
    }
  });
});

describe('sandbox fetch: where allowlisted names lead (Node)', { skip: wasmBuilt ? false : 'npm/wasm/crucible_sandbox_bg.wasm missing' }, () => {
  const seen: string[] = [];
  let target: Server | undefined;
  let port = 0;
  before(async () => {
    const started = await startFetchServer(seen);
    target = started.server;
    port = started.ctx.port;
  });
  after(() => target?.close());

  const fetchOk = (origin: string) =>
    `async function execute(){ try { const r = await fetch('${origin}/ok'); return await r.json(); } catch (e) { return e.message; } }`;

  test('an allowlisted name resolving to a loopback address is refused unless that address is listed too', async () => {
    const nameOnly = await createSandbox({ poolSize: 1, allowHttp: true, fetchDomainAllowlist: [`localhost:${port}`] });
    try {
      const r = await nameOnly.execute({ code: fetchOk(`http://localhost:${port}`), allowlist: ['fetch'] });
      assert.match(String(r.output), /'localhost' resolves to a loopback address; allowlist that address too/);
      assert.doesNotMatch(String(r.output), /127\.0\.0\.1|::1/, 'the guest is not told the address');
      assert.deepEqual(seen, [], 'the refused request reached the server');
    } finally {
      await nameOnly.close();
    }
    const withAddress = await createSandbox({ poolSize: 1, allowHttp: true, fetchDomainAllowlist: [`localhost:${port}`, '127.0.0.1'] });
    try {
      const r = await withAddress.execute({ code: fetchOk(`http://localhost:${port}`), allowlist: ['fetch'] });
      assert.deepEqual(r.output, { ok: true, path: '/ok' });
      assert.deepEqual(seen, [`localhost:${port}`]);
    } finally {
      await withAddress.close();
    }
  });

  test('every connection checks the address it connects to: a name that rebinds to a private address is refused', () => {
    // A scripted resolver (test double): public on the first answer, private on the second.
    const answers = [
      [{ address: '93.184.216.34', family: 4 }],
      [{ address: '10.0.0.5', family: 4 }],
      [{ address: '::ffff:127.0.0.1', family: 6 }],
      [{ address: '100.64.3.4', family: 4 }, { address: '2606:4700::1111', family: 6 }],
    ];
    const lookup = guardedLookup(ipaddr, ['rebind.example'], (_host, _options, callback) => callback(null, answers.shift()!));
    const outcomes: unknown[] = [];
    const record = (error: Error | null, address: unknown) => outcomes.push(error ? `${error.constructor.name}: ${error.message}` : address);
    lookup('rebind.example', {}, record);
    lookup('rebind.example', {}, record);
    lookup('rebind.example', { all: true }, record);
    lookup('rebind.example', { all: true }, record);
    assert.deepEqual(outcomes, [
      '93.184.216.34',
      "FetchRefused: 'rebind.example' resolves to a private address; allowlist that address too to reach it",
      "FetchRefused: 'rebind.example' resolves to a loopback address; allowlist that address too to reach it",
      [{ address: '2606:4700::1111', family: 6 }],
    ]);
    assert.ok(new FetchRefused('x') instanceof Error);
  });

  test('a private address reached through a name is allowed only on the port its entry names', () => {
    // ['api.vendor.com', '10.0.0.5:8443']: whoever answers for api.vendor.com can point it at
    // 10.0.0.5, and must reach 8443 there and nothing else (not :22, not :6379).
    const resolveTo = (address: string): Parameters<typeof guardedLookup>[2] => (_host, _options, callback) => callback(null, [{ address, family: 4 }]);
    const outcomes: unknown[] = [];
    const record = (error: Error | null, address: unknown) => outcomes.push(error ? `${error.constructor.name}: ${error.message}` : address);
    const allowlist = ['api.vendor.com', '10.0.0.5:8443', '10.0.0.6', 'api.vendor.com:80', '10.0.0.7:80'];
    guardedLookup(ipaddr, allowlist, resolveTo('10.0.0.5'), '8443')('api.vendor.com', {}, record);
    guardedLookup(ipaddr, allowlist, resolveTo('10.0.0.5'), '22')('api.vendor.com', {}, record);
    guardedLookup(ipaddr, allowlist, resolveTo('10.0.0.5'), undefined)('api.vendor.com', {}, record);
    // An entry without a port allows every port of its address, as it does for the host.
    guardedLookup(ipaddr, allowlist, resolveTo('10.0.0.6'), '6379')('api.vendor.com', {}, record);
    guardedLookup(ipaddr, allowlist, resolveTo('10.0.0.6'), undefined)('api.vendor.com', {}, record);
    // `10.0.0.7:80` is written like a URL's default port; it pins port 80.
    guardedLookup(ipaddr, allowlist, resolveTo('10.0.0.7'), '80')('api.vendor.com', {}, record);
    guardedLookup(ipaddr, allowlist, resolveTo('10.0.0.7'), '443')('api.vendor.com', {}, record);
    // Public addresses are reached on any port, as before.
    guardedLookup(ipaddr, allowlist, resolveTo('93.184.216.34'), '22')('api.vendor.com', {}, record);
    const wrongPort = "FetchRefused: 'api.vendor.com' resolves to a private address allowlisted for other ports only; allowlist that address with this port too to reach it";
    assert.deepEqual(outcomes, ['10.0.0.5', wrongPort, wrongPort, '10.0.0.6', '10.0.0.6', '10.0.0.7', wrongPort, '93.184.216.34']);
  });

  describe('a name that leads to an address allowlisted with a port (two loopback servers)', () => {
    const seenA: string[] = [];
    const seenB: string[] = [];
    let serverA: Server | undefined;
    let serverB: Server | undefined;
    let portA = 0;
    let portB = 0;
    let box: Sandbox;
    before(async () => {
      const a = await startFetchServer(seenA);
      const b = await startFetchServer(seenB);
      [serverA, serverB, portA, portB] = [a.server, b.server, a.ctx.port, b.ctx.port];
      // 'localhost' without a port, its address with one: the name must not open every port.
      box = await createSandbox({ poolSize: 1, allowHttp: true, fetchDomainAllowlist: ['localhost', `127.0.0.1:${portA}`] });
    });
    after(async () => {
      await box?.close();
      serverA?.close();
      serverB?.close();
    });
    const fetchUrl = (url: string) =>
      `async function execute(){ try { const r = await fetch(${JSON.stringify(url)}); return await r.json(); } catch (e) { return e.name + ': ' + e.message; } }`;
    const refusal = /'localhost' resolves to a loopback address allowlisted for other ports only; allowlist that address with this port too to reach it/;

    test('on the port its entry names, the name reaches the address', async () => {
      const r = await box.execute({ code: fetchUrl(`http://localhost:${portA}/ok`), allowlist: ['fetch'] });
      assert.deepEqual(r.output, { ok: true, path: '/ok' });
      assert.deepEqual(seenA.splice(0), [`localhost:${portA}`]);
    });

    test('on another port of that address, the connection is refused before a byte is sent', async () => {
      const before = seenB.length;
      const r = await box.execute({ code: fetchUrl(`http://localhost:${portB}/ok`), allowlist: ['fetch'] });
      assert.match(String(r.output), refusal);
      assert.doesNotMatch(String(r.output), /127\.0\.0\.1|::1/, 'the guest is not told the address');
      assert.equal(seenB.length, before, 'the refused request reached the other port');
      // The address literal itself on that port was, and stays, refused by the URL check.
      const literal = await box.execute({ code: fetchUrl(`http://127.0.0.1:${portB}/ok`), allowlist: ['fetch'] });
      assert.match(String(literal.output), /IP address '127\.0\.0\.1' is not in the fetch allowlist/);
      assert.equal(seenB.length, before);
    });

    test('the host side rejects with a FetchRefused, in both the first request and a redirect', async () => {
      const guarded = await guardedFetch(['localhost', `127.0.0.1:${portA}`]);
      const policy = { allowlist: ['localhost', `127.0.0.1:${portA}`], allowHttp: true, maxBodyBytes: 1024, maxRedirects: 5, fetch: guarded.fetch };
      try {
        for (const url of [`http://localhost:${portB}/ok`, `http://localhost:${portA}/redirect?to=${encodeURIComponent(`http://localhost:${portB}/ok`)}`]) {
          await assert.rejects(bridgedFetch(JSON.stringify({ url, method: 'GET', headers: [] }), policy), (e: unknown) => {
            assert.ok(e instanceof FetchRefused, `expected a FetchRefused, got ${String(e)}`);
            assert.match(e.message, refusal);
            return true;
          });
        }
        assert.deepEqual(seenB, [], 'a refused request reached the other port');
      } finally {
        await guarded.close();
      }
      seenA.splice(0);
    });

    test('a redirect from the allowed port to another port of the address is refused', async () => {
      const to = `http://localhost:${portB}/ok`;
      const r = await box.execute({ code: fetchUrl(`http://127.0.0.1:${portA}/redirect?to=${encodeURIComponent(to)}`), allowlist: ['fetch'] });
      assert.match(String(r.output), refusal);
      assert.deepEqual(seenA.splice(0), [`127.0.0.1:${portA}`]);
      assert.deepEqual(seenB, [], 'the redirect reached the other port');
    });
  });
});

describe('sandbox fetch: a binary body as text (Node)', () => {
  test('a body under the cap whose text outgrows it (invalid UTF-8 as U+FFFD) is refused saying so, not as a body over the cap', async () => {
    const server = createServer((_req, res) => res.end(Buffer.alloc(600, 0xff)));
    const { origin, port } = await listenOnLoopback(server);
    const policy = { allowlist: [`127.0.0.1:${port}`], allowHttp: true, maxBodyBytes: 1000, maxRedirects: 5, fetch: globalThis.fetch };
    try {
      await assert.rejects(bridgedFetch(JSON.stringify({ url: `${origin}/`, method: 'GET', headers: [] }), policy), (e: unknown) => {
        assert.ok(e instanceof FetchRefused, String(e));
        assert.match(e.message, /response body of 600 bytes is not UTF-8 text: .* it is 1800 bytes, more than the 1000-byte limit/);
        return true;
      });
    } finally {
      server.close();
    }
  });
});

describe('sandbox fetch: credentials across origins (Node)', () => {
  test("the guest's Authorization and Cookie headers do not follow a redirect to another origin, only within one", async () => {
    // Each server records what reached it and redirects where `?to=` says, if it says.
    const seen: Array<{ at: string; headers: IncomingHttpHeaders }> = [];
    const hop = (name: string) =>
      createServer((req, res) => {
        const to = new URL(req.url ?? '/', 'http://x').searchParams.get('to');
        if (to) return res.writeHead(302, { location: to }).end();
        seen.push({ at: name, headers: req.headers });
        res.end('ok');
      });
    const [serverA, serverB] = [hop('a'), hop('b')];
    const [a, b] = [await listenOnLoopback(serverA), await listenOnLoopback(serverB)];
    const policy = { allowlist: [`127.0.0.1:${a.port}`, `127.0.0.1:${b.port}`], allowHttp: true, maxBodyBytes: 1024, maxRedirects: 5, fetch: globalThis.fetch };
    const fetchVia = (to: string) =>
      bridgedFetch(JSON.stringify({ url: `${a.origin}/?to=${encodeURIComponent(to)}`, method: 'GET', headers: [['authorization', 'Bearer TOKEN-FOR-A'], ['cookie', 'session=a'], ['x-trace', '1']] }), policy);
    try {
      await fetchVia(`${b.origin}/`);
      assert.equal(seen[0]?.at, 'b');
      assert.equal(seen[0]?.headers.authorization, undefined, 'the token for A reached B');
      assert.equal(seen[0]?.headers.cookie, undefined);
      assert.equal(seen[0]?.headers['x-trace'], '1', 'other headers follow');
      // Within one origin they follow, as the Fetch standard has it.
      await fetchVia(`${a.origin}/final`);
      assert.deepEqual([seen[1]?.at, seen[1]?.headers.authorization, seen[1]?.headers.cookie], ['a', 'Bearer TOKEN-FOR-A', 'session=a']);
    } finally {
      serverA.close();
      serverB.close();
    }
  });
});

/** One request the bridge-limits server received. */
interface Received {
  method: string;
  url: string;
  headers: IncomingHttpHeaders;
  body: string;
}

/** How a `/stream` response ended: bytes written, and whether all of them were. */
interface StreamEnd {
  sent: number;
  complete: boolean;
}

/**
 * Test double: a local HTTP server for the bridge's limits. `/echo` answers with what it got;
 * `/hops?n=` redirects (302) n times before answering; `/see-other` (303) and `/temporary` (307)
 * redirect to `/echo`; `/stream?bytes=` streams that many bytes chunked, with no Content-Length,
 * writing only as fast as the client reads. It records every request and how each stream ended.
 */
function startBridgeServer(): Promise<{ server: Server; origin: string; port: number; received: Received[]; streams: Array<Promise<StreamEnd>> }> {
  const received: Received[] = [];
  const streams: Array<Promise<StreamEnd>> = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString();
      received.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body });
      const url = new URL(req.url ?? '/', 'http://x');
      const n = Number(url.searchParams.get('n'));
      if (url.pathname === '/echo') {
        res.setHeader('content-type', 'application/json');
        res.end(JSON.stringify({ method: req.method, body }));
      } else if (url.pathname === '/hops') {
        if (n > 0) {
          res.writeHead(302, { location: `/hops?n=${n - 1}` }).end();
        } else {
          res.end('arrived');
        }
      } else if (url.pathname === '/see-other' || url.pathname === '/temporary') {
        res.writeHead(url.pathname === '/see-other' ? 303 : 307, { location: '/echo' }).end();
      } else if (url.pathname === '/controls') {
        res.end(Buffer.alloc(n, 1));
      } else if (url.pathname === '/stream') {
        const total = Number(url.searchParams.get('bytes'));
        const chunk = Buffer.alloc(16 * 1024, 'x');
        let sent = 0;
        streams.push(new Promise((resolve) => res.on('close', () => resolve({ sent, complete: res.writableFinished }))));
        // No Content-Length: Node sends the body chunked, so only counting can catch its size.
        res.writeHead(200, { 'content-type': 'text/plain' });
        const pump = (): void => {
          while (sent < total && !res.destroyed) {
            sent += chunk.byteLength;
            if (!res.write(chunk)) {
              res.once('drain', pump);
              return;
            }
          }
          if (!res.destroyed) res.end();
        };
        pump();
      } else {
        res.statusCode = 404;
        res.end();
      }
    });
  });
  return listenOnLoopback(server).then(({ origin, port }) => ({ server, origin, port, received, streams }));
}

describe('sandbox fetch: redirects, body and header limits on the host side (Node)', { skip: wasmBuilt ? false : 'npm/wasm/crucible_sandbox_bg.wasm missing' }, () => {
  const MAX_BODY = 64 * 1024;
  let target: Awaited<ReturnType<typeof startBridgeServer>>;
  let box: Sandbox;
  before(async () => {
    target = await startBridgeServer();
    box = await createSandbox({ poolSize: 1, timeoutMs: 5000, allowHttp: true, fetchDomainAllowlist: ['127.0.0.1'], maxFetchBodyBytes: MAX_BODY });
  });
  after(async () => {
    await box?.close();
    target?.server.close();
  });

  /** Fetches `input.url` with `input.init`; the outcome, or the refusal's message, as data. */
  const FETCH_ONE =
    'async function execute(input){ try { const r = await fetch(input.url, input.init); return { status: r.status, url: r.url, body: await r.text() }; } catch (e) { return { refused: e.message }; } }';
  const fetchOne = async (url: string, init?: Record<string, unknown>) => {
    const r = await box.execute({ code: FETCH_ONE, input: { url, init }, allowlist: ['fetch'] });
    assert.equal(r.status, 'ok', JSON.stringify(r));
    return r.output as { status?: number; url?: string; body?: string; refused?: string };
  };

  test('up to 5 redirects are followed; a 6th is refused as too many and never requested', async () => {
    target.received.length = 0;
    assert.deepEqual(await fetchOne(`${target.origin}/hops?n=5`), { status: 200, url: `${target.origin}/hops?n=0`, body: 'arrived' });
    assert.equal(target.received.length, 6);
    target.received.length = 0;
    const refused = await fetchOne(`${target.origin}/hops?n=6`);
    assert.match(String(refused.refused), /too many redirects/, JSON.stringify(refused));
    // The first request and 5 followed hops; the 6th redirect's target was never fetched.
    assert.deepEqual(
      target.received.map((r) => r.url),
      [6, 5, 4, 3, 2, 1].map((n) => `/hops?n=${n}`),
    );
  });

  test('a 303 after a POST is followed with a GET without the body; a 307 keeps both', async () => {
    const init = { method: 'POST', headers: { 'content-type': 'text/plain' }, body: 'posted-payload' };
    target.received.length = 0;
    const seeOther = await fetchOne(`${target.origin}/see-other`, init);
    assert.deepEqual(seeOther, { status: 200, url: `${target.origin}/echo`, body: JSON.stringify({ method: 'GET', body: '' }) });
    assert.deepEqual(
      target.received.map((r) => [r.method, r.url, r.body]),
      [
        ['POST', '/see-other', 'posted-payload'],
        ['GET', '/echo', ''],
      ],
    );
    assert.equal(target.received[1]!.headers['content-length'], undefined, 'the GET declares no body');
    assert.equal(target.received[1]!.headers['content-type'], undefined, "nor the POST body's type");
    target.received.length = 0;
    const temporary = await fetchOne(`${target.origin}/temporary`, init);
    assert.deepEqual(temporary, { status: 200, url: `${target.origin}/echo`, body: JSON.stringify({ method: 'POST', body: 'posted-payload' }) });
  });

  test('a body of control characters, which JSON would grow sixfold on its way to the Worker, is refused', async () => {
    const r = await fetchOne(`${target.origin}/controls?n=${MAX_BODY - 1024}`);
    assert.match(String(r.refused), /escapes to \d+ characters of JSON/, JSON.stringify(r).slice(0, 300));
    // Text of the same size crosses as it is.
    const text = await fetchOne(`${target.origin}/echo`, { method: 'POST', body: 'x'.repeat(MAX_BODY - 1024) });
    assert.equal(text.status, 200);
  });

  test('a body streamed without Content-Length past maxFetchBodyBytes is refused and the host stops reading', async () => {
    target.streams.length = 0;
    const total = 64 * 1024 * 1024;
    const r = await fetchOne(`${target.origin}/stream?bytes=${total}`);
    assert.deepEqual(r, { refused: `fetch failed: response body exceeds ${MAX_BODY} bytes` });
    assert.equal(target.streams.length, 1);
    const timeout = new Promise<'still streaming'>((resolve) => setTimeout(resolve, 3000, 'still streaming'));
    const end = await Promise.race([target.streams[0]!, timeout]);
    assert.notEqual(end, 'still streaming', 'the host kept the response open');
    const { sent, complete } = end as StreamEnd;
    // What the socket buffers held when the host cancelled, not the 64 MiB offered.
    assert.equal(complete, false, `the server sent the whole body (${sent} bytes)`);
    assert.ok(sent < 16 * 1024 * 1024, `the server sent ${sent} bytes before the host stopped reading`);
  });

  test('request headers that steer the connection or a proxy are dropped; others are sent', async () => {
    const steering: Array<[string, string]> = [
      ['Host', 'evil.example'],
      ['Connection', 'close'],
      ['Content-Length', '5'],
      ['Transfer-Encoding', 'chunked'],
      ['Upgrade', 'websocket'],
      ['Proxy-Authorization', 'Basic Z3Vlc3Q6c2VjcmV0'],
      ['Keep-Alive', 'timeout=999'],
      ['TE', 'trailers'],
      ['Trailer', 'X-Late'],
    ];
    const code = `async function execute(input){ const out = []; for (const [name, value] of input.steering) { try { const r = await fetch(input.url, { headers: { [name]: value, 'X-Kept': 'yes' } }); out.push(r.status); } catch (e) { out.push(name + ': ' + e.message); } } return out; }`;
    target.received.length = 0;
    const r = await box.execute({ code, input: { url: `${target.origin}/echo`, steering }, allowlist: ['fetch'] });
    assert.equal(r.status, 'ok', JSON.stringify(r));
    assert.deepEqual(r.output, steering.map(() => 200));
    assert.equal(target.received.length, steering.length);
    steering.forEach(([name, value], i) => {
      const headers = target.received[i]!.headers;
      assert.equal(headers['x-kept'], 'yes', `request ${i} lost an ordinary header`);
      assert.notEqual(headers[name.toLowerCase()], value, `the guest's ${name} header reached the server`);
    });
    assert.ok(target.received.every((req) => req.headers.host === `127.0.0.1:${target.port}`));
    // undici overrides Host and Content-Length itself; a custom `fetch` (an option) does not, so
    // the bridge must not hand it any of these either.
    const handed: string[][] = [];
    const recording: typeof fetch = async (_url, init) => {
      handed.push([...new Headers(init?.headers).keys()]);
      return new Response('{}', { status: 200 });
    };
    const custom = await createSandbox({ poolSize: 1, fetchDomainAllowlist: ['api.example'], fetch: recording });
    try {
      const viaCustom = await custom.execute({ code, input: { url: 'https://api.example/echo', steering }, allowlist: ['fetch'] });
      assert.deepEqual(viaCustom.output, steering.map(() => 200), JSON.stringify(viaCustom));
      assert.deepEqual(handed, steering.map(() => ['x-kept']));
    } finally {
      await custom.close();
    }
  });
});

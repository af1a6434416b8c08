/**
 * Idle sandbox Workers are retired (`idleTimeoutMs`): a service holding many agents must not
 * keep every Worker (about 28 MB each) for good. Real Workers, in Node; they load the built
 * wasm from `npm/wasm/` (`npm run build:wasm`).
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { describe, test } from 'node:test';

import { createSandbox, sandboxLimits, type SandboxResult } from '../src/sandbox/index.js';

const wasmBuilt = existsSync(new URL('../wasm/crucible_sandbox_bg.wasm', import.meta.url));
const DOUBLE = { code: 'function execute(i){ return i * 2; }' };

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Waits until `done()` holds, for at most `ms`. */
async function until(done: () => boolean, ms: number, what: string): Promise<void> {
  const deadline = performance.now() + ms;
  while (!done()) {
    if (performance.now() > deadline) assert.fail(`not within ${ms} ms: ${what}`);
    await sleep(10);
  }
}

/** The process's OS threads (Linux), or `undefined` elsewhere: a Worker's thread is gone from
 *  it once it has exited, not merely been asked to. */
function osThreads(): number | undefined {
  try {
    return Number(/^Threads:\s+(\d+)/m.exec(readFileSync('/proc/self/status', 'utf8'))?.[1]);
  } catch {
    return undefined;
  }
}

function outputs(results: SandboxResult[]): unknown[] {
  return results.map((r) => r.output ?? r.error?.code);
}

// Options are checked before the wasm is loaded, so these run without a build.
describe('idleTimeoutMs is checked with a SandboxError', () => {
  test('a positive number of milliseconds or Infinity; 0, a negative, NaN, a string or past the timer range is refused', async () => {
    for (const idleTimeoutMs of [0, -1, Number.NaN, '60000', 2 ** 31]) {
      await assert.rejects(createSandbox({ lazy: true, idleTimeoutMs: idleTimeoutMs as never }), { name: 'SandboxError', message: /idleTimeoutMs must be a positive number of milliseconds \(at most 2147483647\) or Infinity/ }, String(idleTimeoutMs));
    }
    assert.equal(sandboxLimits({ lazy: true }).idleTimeoutMs, 60_000, 'a lazy sandbox retires idle Workers by default');
    assert.equal(sandboxLimits({ lazy: true, idleTimeoutMs: Infinity }).idleTimeoutMs, Infinity);
    assert.equal(sandboxLimits({ lazy: true, idleTimeoutMs: 2 ** 31 - 1 }).idleTimeoutMs, 2 ** 31 - 1);
  });

  test('an eager sandbox keeps its Workers: no default idle timeout, and a finite one is refused', async () => {
    assert.equal(sandboxLimits({}).idleTimeoutMs, Infinity);
    assert.equal(sandboxLimits({ lazy: false, idleTimeoutMs: Infinity }).idleTimeoutMs, Infinity);
    await assert.rejects(createSandbox({ idleTimeoutMs: 1000 }), { name: 'SandboxError', message: /idleTimeoutMs retires the Workers of a lazy sandbox \(lazy: true\)/ });
    await assert.rejects(createSandbox({ lazy: false, idleTimeoutMs: 1000 }), { name: 'SandboxError', message: /lazy sandbox/ });
  });
});

describe('idle sandbox Workers are retired (Node)', { skip: wasmBuilt ? false : 'npm/wasm/crucible_sandbox_bg.wasm missing: run npm run build:wasm' }, () => {
  test('Workers idle for idleTimeoutMs exit; the next executions start them again, without counting a failure or a kill', async () => {
    const threadsBefore = osThreads();
    // maxQueued 0: the retired Workers count as free, as a lazy pool's unstarted ones do.
    const box = await createSandbox({ poolSize: 2, lazy: true, idleTimeoutMs: 300, maxQueued: 0 });
    try {
      assert.deepEqual(outputs(await Promise.all([1, 2].map((input) => box.execute({ ...DOUBLE, input })))), [2, 4]);
      assert.equal(box.stats().workers, 2);
      await until(() => box.stats().workers === 0, 5000, 'both Workers retired');
      assert.deepEqual([box.stats().workersRetired, box.stats().workersKilled], [2, 0]);
      if (threadsBefore !== undefined) await until(() => osThreads() === threadsBefore, 5000, `the Workers' threads exited (${osThreads()} threads, ${threadsBefore} before)`);
      assert.deepEqual(outputs(await Promise.all([3, 4].map((input) => box.execute({ ...DOUBLE, input })))), [6, 8], 'served by Workers started again, not refused');
      const stats = box.stats();
      assert.deepEqual([stats.workers, stats.workersStarted, stats.workersKilled], [2, 4, 0], JSON.stringify(stats));
    } finally {
      await box.close();
    }
  });

  test('a Worker in use is not retired: the idle time counts from its last execution', async () => {
    const box = await createSandbox({ poolSize: 1, lazy: true, idleTimeoutMs: 400 });
    try {
      for (let n = 0; n < 8; n++) {
        assert.equal((await box.execute({ ...DOUBLE, input: n })).output, n * 2);
        await sleep(150);
      }
      assert.deepEqual([box.stats().workersStarted, box.stats().workersRetired], [1, 0], 'one Worker served 1.2 s of executions 150 ms apart');
    } finally {
      await box.close();
    }
  });

  test('an execution arriving as the idle timeout fires, or while its Worker exits, succeeds', async () => {
    const idleTimeoutMs = 200;
    const box = await createSandbox({ poolSize: 1, lazy: true, idleTimeoutMs });
    try {
      assert.equal((await box.execute({ ...DOUBLE, input: 0 })).output, 0);
      // Around the moment the timer is due: just before (the Worker still idle), at it (the
      // same timers phase) and just after (its Worker being terminated).
      for (const offset of [-5, 0, 1, 5]) {
        const idleSince = box.stats().workersRetired;
        await sleep(idleTimeoutMs + offset);
        const result = await box.execute({ ...DOUBLE, input: offset });
        assert.equal(result.output, offset * 2, `${offset} ms from the timeout: ${JSON.stringify(result)}`);
        assert.ok(box.stats().workersRetired - idleSince <= 1);
      }
      // The moment retirement begins: the Worker asked to terminate, its thread not yet gone.
      await sleep(50);
      const retired = box.stats().workersRetired;
      while (box.stats().workersRetired === retired) await new Promise((resolve) => setImmediate(resolve));
      assert.equal((await box.execute({ ...DOUBLE, input: 21 })).output, 42);
      const stats = box.stats();
      assert.equal(stats.workersKilled, 0, JSON.stringify(stats));
      assert.equal(stats.workers, 1, 'one Worker, as poolSize says');
    } finally {
      await box.close();
    }
  });

  test('a process whose only work is an idle sandbox exits without close(), well before the idle timeout', async () => {
    // The sandbox retires its Workers after 60 s: neither they nor that timer may keep the process alive.
    const started = performance.now();
    const child = spawn(process.execPath, ['--import', 'tsx', new URL('./support/idle-sandbox-process.ts', import.meta.url).pathname], {
      cwd: new URL('..', import.meta.url).pathname,
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    child.stdout.setEncoding('utf8');
    child.stdout.on('data', (chunk: string) => (out += chunk));
    const code = await new Promise<number | null>((resolve) => {
      const kill = setTimeout(() => child.kill('SIGKILL'), 30_000);
      child.on('close', (exitCode) => {
        clearTimeout(kill);
        resolve(exitCode);
      });
    });
    const took = performance.now() - started;
    assert.equal(out.trim(), '42', 'the execution ran');
    assert.equal(code, 0, `exited by itself (took ${Math.round(took)} ms)`);
    assert.ok(took < 30_000, `took ${Math.round(took)} ms`);
  });
});

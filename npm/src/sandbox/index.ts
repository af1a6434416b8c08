/**
 * The sandbox host: `createSandbox()` runs forged tools in disposable Worker-hosted wasm
 * instances with hard time and memory limits (DESIGN decisions 2–4).
 *
 * ```ts
 * const sandbox = await createSandbox({ timeoutMs: 5000, memoryMB: 128, fetchDomainAllowlist: ['api.example.com'], poolSize: 2 });
 * const r = await sandbox.execute({ code: 'function execute(input) { return input.n + 1; }', input: { n: 1 } });
 * await sandbox.close();
 * ```
 * Runtime files: `dist/sandbox/worker.js` (loaded as a Worker next to this module) and
 * `wasm/crucible_sandbox_bg.wasm` (two directories up); both can be overridden in the options.
 */
import { describeType, describeValue, isRecord, MAX_TIMER_MS, messageOf, SandboxError } from '../errors.js';
import { guardedFetch } from './guarded-fetch.js';
import { isNode, loadSandboxModule, WorkerPool } from './pool.js';
import type { Sandbox, SandboxOptions } from './types.js';

export type { ExecuteOptions, Sandbox, SandboxOptions, SandboxRequest, SandboxResult, SandboxStatus, SandboxStats } from './types.js';
export { checkUrl, FetchRefused } from './fetch-bridge.js';

/** `createSandbox`'s limits with their defaults, or the `SandboxError` naming one it cannot use
 *  (checked before anything loads: `createAgent` checks its default sandbox's limits with it). */
export function sandboxLimits(options: SandboxOptions) {
  const timeoutMs = options.timeoutMs ?? 5000;
  const memoryMB = options.memoryMB ?? 128;
  const poolSize = options.poolSize ?? 2;
  const maxQueued = options.maxQueued ?? 256;
  // Timers fire at once past MAX_TIMER_MS, which would time out every execution.
  if (!(typeof timeoutMs === 'number' && timeoutMs > 0 && timeoutMs <= MAX_TIMER_MS)) throw new SandboxError(`timeoutMs must be a positive number of milliseconds (at most ${MAX_TIMER_MS})`);
  if (!(typeof memoryMB === 'number' && memoryMB >= 32 && memoryMB <= 4096)) throw new SandboxError('memoryMB must be between 32 and 4096');
  if (!(Number.isInteger(poolSize) && poolSize >= 1)) throw new SandboxError('poolSize must be a positive integer');
  if (!(Number.isInteger(maxQueued) && maxQueued >= 0)) throw new SandboxError('maxQueued must be a whole number (0: never wait for a Worker)');
  if (options.lazy !== undefined && typeof options.lazy !== 'boolean') throw new SandboxError(`lazy must be true or false, got ${describeType(options.lazy)}`);
  // Workers that start on demand can be retired when idle; an eager pool was asked to keep them ready.
  const idleTimeoutMs = options.idleTimeoutMs ?? (options.lazy ? 60_000 : Infinity);
  if (!(typeof idleTimeoutMs === 'number' && ((idleTimeoutMs > 0 && idleTimeoutMs <= MAX_TIMER_MS) || idleTimeoutMs === Infinity))) {
    throw new SandboxError(`idleTimeoutMs must be a positive number of milliseconds (at most ${MAX_TIMER_MS}) or Infinity, got ${describeValue(idleTimeoutMs)}`);
  }
  if (!options.lazy && idleTimeoutMs !== Infinity) {
    throw new SandboxError('idleTimeoutMs retires the Workers of a lazy sandbox (lazy: true); an eager one keeps its poolSize Workers ready');
  }
  const allowlist = options.fetchDomainAllowlist ?? [];
  // A string here would be spread into one "host" per character.
  // Array.from: a hole of a sparse array is an entry too (every() skips holes).
  if (!Array.isArray(allowlist) || !Array.from(allowlist).every((host) => typeof host === 'string' && host !== '')) {
    throw new SandboxError(
      `fetchDomainAllowlist must be an array of host names, e.g. ['api.example.com', 'localhost:8080']; got ${typeof allowlist === 'string' ? JSON.stringify(allowlist) : Array.isArray(allowlist) ? 'an array with a non-string or empty entry' : typeof allowlist}`,
    );
  }
  for (const entry of allowlist) {
    const problem = notAHostName(entry);
    if (problem) {
      throw new SandboxError(
        `fetchDomainAllowlist entry ${JSON.stringify(entry)} is not a host name (${problem}): list a host alone, or a host and a port, e.g. 'api.example.com' or 'localhost:8080'`,
      );
    }
  }
  if (options.allowHttp !== undefined && typeof options.allowHttp !== 'boolean') throw new SandboxError(`allowHttp must be true or false, got ${describeValue(options.allowHttp)}`);
  const allowHttp = options.allowHttp ?? false;
  // The host buffers up to this much of a response before the engine sees it: `Infinity` (which
  // JSON makes `null` on its way to the engine) would leave the host reading an endless body.
  const maxFetchBodyBytes = options.maxFetchBodyBytes ?? 4 * 1024 * 1024;
  if (!(Number.isSafeInteger(maxFetchBodyBytes) && maxFetchBodyBytes >= 1 && maxFetchBodyBytes <= MAX_TIMER_MS)) {
    throw new SandboxError(`maxFetchBodyBytes must be a whole number of bytes from 1 to ${MAX_TIMER_MS}, got ${describeValue(maxFetchBodyBytes)}`);
  }
  const startTimeoutMs = options.startTimeoutMs ?? 20_000;
  const retryStartAfterMs = options.retryStartAfterMs ?? 30_000;
  // A timer past MAX_TIMER_MS (or given a non-number) fires at once: every Worker would fail its
  // start. `retryStartAfterMs` is only compared with the clock, never handed to a timer, so any
  // number of 0 or more will do, Infinity (never start them again) included.
  if (!(typeof startTimeoutMs === 'number' && startTimeoutMs > 0 && startTimeoutMs <= MAX_TIMER_MS)) {
    throw new SandboxError(`startTimeoutMs must be a positive number of milliseconds (at most ${MAX_TIMER_MS}), got ${describeValue(startTimeoutMs)}`);
  }
  if (!(typeof retryStartAfterMs === 'number' && retryStartAfterMs >= 0)) {
    throw new SandboxError(`retryStartAfterMs must be a number of milliseconds (0 or more, or Infinity), got ${describeValue(retryStartAfterMs)}`);
  }
  return { timeoutMs, memoryMB, poolSize, maxQueued, idleTimeoutMs, fetchDomainAllowlist: [...allowlist], allowHttp, maxFetchBodyBytes, startTimeoutMs, retryStartAfterMs };
}

/**
 * Why an allowlist entry is not `host` or `host:port`, or `undefined`. The fetch bridge reads an
 * entry as the host of `http://<entry>`, so anything more is not an error there but another
 * host: 'https://api.example.com' is the host `https` (which the host's DNS search domains may
 * resolve) and leaves api.example.com refused, 'api.example.com/v1' allows all of that host,
 * '*.example.com' matches nothing, and an unparsable entry throws a bare TypeError out of
 * createSandbox (Node) or from every fetch (elsewhere). Refused here, they cannot mislead.
 */
function notAHostName(entry: string): string | undefined {
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(entry)) return 'no scheme';
  if (entry.includes('*')) return 'no wildcards: list each host';
  let url: URL;
  try {
    url = new URL(`http://${entry}`);
  } catch {
    return 'it does not parse as one';
  }
  if (url.username || url.password || entry.includes('@')) return 'no user name';
  if (url.pathname !== '/' || url.search || url.hash || /[/?#\\]/.test(entry)) return 'no path, query or fragment';
  return undefined;
}

/** Where a sandbox wasm that did not load was looked for, and what to do about it. */
function sandboxWasmHint(given: SandboxOptions['wasm']): string {
  // A location the caller gave is theirs to fix.
  if (given !== undefined) return ' from the `wasm` option';
  // The package's own file: missing from a checkout not yet built, or (in a browser) not
  // copied beside the bundle by a bundler that copies no assets.
  if (isNode) return ' (run `npm run build:wasm` in a checkout)';
  return " beside the package's modules (a bundler that copies no assets: serve wasm/crucible_sandbox_bg.wasm and the Worker, and pass `emergent.sandbox: await createSandbox({ workerUrl, wasm })`)";
}

/** Starts a warm pool of sandbox Workers and resolves when every Worker is ready; with
 *  `lazy: true`, resolves at once and the first execution starts them. */
export async function createSandbox(options: SandboxOptions = {}): Promise<Sandbox> {
  if (!isRecord(options as unknown)) {
    throw new SandboxError(`createSandbox takes an options object (or nothing), e.g. createSandbox({ timeoutMs: 5000 }); got ${describeType(options)}`);
  }
  const { timeoutMs, memoryMB, poolSize, maxQueued, idleTimeoutMs, fetchDomainAllowlist, allowHttp, maxFetchBodyBytes, startTimeoutMs, retryStartAfterMs } = sandboxLimits(options);
  // A SharedWorker or a service worker has no Worker to start: said now, not as a forge that
  // fails (seemingly for a while) at every test.
  if (!isNode && typeof (globalThis as { Worker?: unknown }).Worker !== 'function') {
    throw new SandboxError('this context cannot start Workers (a SharedWorker or a service worker?): run the agent in a page or a dedicated Worker');
  }
  let module: WebAssembly.Module;
  try {
    module = await loadSandboxModule(options.wasm);
  } catch (cause) {
    throw new SandboxError(`cannot load the sandbox wasm${sandboxWasmHint(options.wasm)}: ${messageOf(cause)}`, { cause });
  }
  // In Node the default fetch also checks where allowlisted names resolve (guarded-fetch.ts);
  // with nothing allowlisted no request can leave, so undici is not even loaded.
  const guarded = !options.fetch && isNode && fetchDomainAllowlist.length > 0 ? await guardedFetch(fetchDomainAllowlist) : undefined;
  const fetchImpl = options.fetch ?? guarded?.fetch ?? globalThis.fetch?.bind(globalThis);
  const pool = new WorkerPool(module, {
    timeoutMs,
    memoryMB,
    poolSize,
    maxQueued,
    fetchDomainAllowlist,
    allowHttp,
    maxFetchBodyBytes,
    workerUrl: options.workerUrl,
    fetch: fetchImpl,
    startTimeoutMs,
    retryStartAfterMs,
    idleTimeoutMs,
  });
  try {
    if (!options.lazy) await pool.start();
  } catch (cause) {
    await pool.close();
    await guarded?.close();
    throw new SandboxError('sandbox workers failed to start', { cause });
  }
  const sandbox: Sandbox = {
    execute: (request, executeOptions) => pool.execute(request, executeOptions),
    close: async () => {
      await pool.close();
      await guarded?.close();
    },
    stats: () => pool.stats(),
  };
  // The agent core's JSON fast path (src/wasm/interop.rs, `JsSandbox`); not part of the API.
  // Not enumerable: a host that wraps this sandbox with spread (`{ ...sandbox, execute }`)
  // must not have its own `execute` bypassed.
  // `tenant`: the agent an execution is for, when agents share this sandbox (see `forAgent`).
  Object.defineProperty(sandbox, Symbol.for('crucible.sandbox.executeJson'), {
    value: (requestJson: string, tenant?: unknown) => pool.executeJson(requestJson, typeof tenant === 'string' ? tenant : ''),
  });
  return sandbox;
}

/**
 * Public types of the sandbox: `createSandbox(options)` → `{ execute(request), close() }`.
 * Mirrors the Rust `SandboxRequest`/`SandboxResult` (src/sandbox/mod.rs).
 */

declare global {
  // Empty here: it merges with the DOM library's declaration where a program has it, and lets
  // a Node-only program (no DOM library) read these types without `skipLibCheck`.
  namespace WebAssembly {
    // eslint-disable-next-line @typescript-eslint/no-empty-interface
    interface Module {}
  }
}

/** Options of {@link createSandbox}. */
export interface SandboxOptions {
  /** Wall clock per execution, async work included. The Worker is terminated when it passes. Default 5000. */
  timeoutMs?: number;
  /**
   * Maximum of each instance's `WebAssembly.Memory` (enforced). Default 128, from 32 to 4096. A
   * Worker starts with 16 MiB; one that has used more than half the rest is replaced after its
   * execution (a wasm memory never shrinks, and some engine state outlives executions).
   */
  memoryMB?: number;
  /**
   * Exact hostnames `fetch` may reach (`host` or `host:port`). Default: none. An entry with
   * more (a scheme, a path, user info, a `*`) is refused with a `SandboxError`: it is no host. Every redirect
   * hop is re-checked in Node; browsers hide redirect targets (`opaqueredirect`), so there a
   * redirect is refused with "redirects cannot be checked in this environment".
   *
   * In Node (default `fetch`), names must also lead somewhere public: a connection to a
   * loopback, private, link-local or other non-public address is refused unless that address is
   * listed too (`['localhost:8080', '127.0.0.1:8080']`). The address is checked when the socket
   * connects, so DNS rebinding cannot slip past it. IP literals in URLs must be listed exactly.
   * An entry without a port allows every port of its host: a bare `'127.0.0.1'` opens every
   * local service to forged code.
   */
  fetchDomainAllowlist?: readonly string[];
  /** Allow `http:` URLs for `fetch` (tests, local services). Default false: `https:` only. */
  allowHttp?: boolean;
  /** Workers kept ready (started in `createSandbox`, or by the first execution when `lazy`). Default 2. */
  poolSize?: number;
  /**
   * Start the Workers on the first execution instead of in `createSandbox` (default false).
   * No Worker runs, and none of their memory (about 28 MB each) is taken, until forged code
   * does; the module is still compiled now. The first execution waits for them, and Workers
   * that cannot start fail the executions waiting for them (`worker_start`) rather than
   * `createSandbox`; the next execution tries again. An agent's default sandbox is lazy.
   */
  lazy?: boolean;
  /**
   * A lazy sandbox's Worker idle for this many ms is terminated, and its memory returned; an
   * execution that finds no idle Worker starts the retired ones again (as the first execution
   * does) and waits for them. Default 60000 for a lazy sandbox; `Infinity` keeps the Workers
   * until `close()`. Must be positive (at most 2147483647) or `Infinity`: 0 would start a
   * Worker for nearly every execution. An eager sandbox (not `lazy`) keeps its `poolSize`
   * Workers ready: a finite value there is refused. The timers do not keep a Node process alive.
   */
  idleTimeoutMs?: number;
  /**
   * Executions that may wait for a free Worker. One past it ends at once with
   * `status: 'error'`, `error.code: 'queue_full'` instead of waiting behind all the others
   * (waiting does not count against `timeoutMs`). Default 256. Waiting executions take free
   * Workers in turns by the code they run, first come first served within one code: many
   * executions of one code (a forge's test cases, up to 32) that run to the deadline hold an
   * execution of another code for about one deadline and one Worker restart, not for all of them.
   */
  maxQueued?: number;
  /** Cap on a fetched response body, a whole number of bytes from 1 to 2147483647. Default
   *  4 MiB. A body that would grow past twice the cap as the JSON text it crosses to the Worker
   *  in (control characters escape to six) is refused too. */
  maxFetchBodyBytes?: number;
  /** Override where the Worker script is loaded from (bundlers that copy no assets: esbuild);
   *  a relative path is read against the page. */
  workerUrl?: string | URL;
  /** Override the sandbox wasm: a compiled module, or where to load its bytes from (a relative
   *  path read against the page in a browser, against this module in Node). */
  wasm?: WebAssembly.Module | string | URL;
  /** A Worker that has not started within this many ms is discarded as failed. Default 20000. */
  startTimeoutMs?: number;
  /**
   * When Workers keep failing to start (three in a row), the sandbox leaves that position
   * empty (with no Worker left, it fails executions at once with `worker_start`) for this many
   * ms; the next execution after that starts Workers in the empty positions again, each with
   * three starts of its own. 0: every execution after a failed start tries again (each may wait
   * out the starts); `Infinity`: positions given up stay empty for good. Default 30000.
   */
  retryStartAfterMs?: number;
  /**
   * `fetch` implementation used by the bridge. Default: in Node, undici's fetch with the
   * connect-time address check above; in browsers, `globalThis.fetch`. A custom `fetch` gets
   * the allowlist and redirect checks but resolves names its own way.
   */
  fetch?: typeof globalThis.fetch;
}

/** One execution of model-written code. */
export interface SandboxRequest {
  /** Source defining `function execute(input)` (sync or async). */
  code: string;
  /** JSON input passed to `execute`. */
  input?: unknown;
  /** Opt-in host APIs: `'fetch'`, `'crypto'`. Default `[]`. */
  allowlist?: Array<'fetch' | 'crypto'>;
}

export type SandboxStatus = 'ok' | 'error' | 'timeout' | 'memory' | 'rejected';

/** The result of one execution. `execute` never rejects for guest behaviour. */
export interface SandboxResult {
  status: SandboxStatus;
  /** JSON output when `status === 'ok'`. */
  output?: unknown;
  /** Detail when `status !== 'ok'`. */
  error?: { code: string; message: string };
  /** Bounded console output. */
  logs: string[];
  /** Host-measured wall-clock duration. */
  durationMs: number;
}

/** Pool counters (for benchmarks and diagnostics). */
export interface SandboxStats {
  workersStarted: number;
  workersKilled: number;
  /** Workers replaced after a successful execution because their memory had grown past half
   *  the room they started with (some engine state outlives executions; see `memoryMB`). */
  workersRecycled: number;
  /** Workers terminated after `idleTimeoutMs` without an execution. */
  workersRetired: number;
  /** Workers the sandbox has now: starting, idle or running (not the retired, replaced or
   *  closed ones, whose threads are exiting or gone). */
  workers: number;
  /** Milliseconds from the last kill until its replacement was ready. */
  lastReplacementMs: number | undefined;
}

/** Options of one {@link Sandbox.execute}. */
export interface ExecuteOptions {
  /** Ends the execution when aborted: a queued one is dropped, a running one's Worker is
   *  terminated and replaced. The result is then `status: 'error'`, `error.code: 'aborted'`. */
  signal?: AbortSignal;
}

export interface Sandbox {
  execute(request: SandboxRequest, options?: ExecuteOptions): Promise<SandboxResult>;
  /** Ends the executions waiting or running (`closed`) and stops the Workers; resolves once
   *  their threads have exited (in Node; browsers do not tell when a Worker is gone). */
  close(): Promise<void>;
  /** The pool's counters, and how many Workers it has now (for diagnostics and benchmarks). */
  stats(): SandboxStats;
}

/**
 * The Worker pool: warm Workers, one execution each at a time, preemption by termination.
 * On deadline the Worker is terminated and replaced (`timeout`); on a trap the instance is
 * discarded and replaced (`memory` when an allocation failed, else `error`).
 */
import { describeValue, messageOf } from '../errors.js';
import { bridgedFetch } from './fetch-bridge.js';
import type { HostToWorker, WorkerToHost } from './protocol.js';
import type { ExecuteOptions, SandboxOptions, SandboxRequest, SandboxResult, SandboxStats } from './types.js';

export const isNode =
  typeof process !== 'undefined' && !!process.versions?.node && typeof (globalThis as { window?: unknown }).window === 'undefined';

/** A runtime-neutral handle on one Worker. */
interface WorkerHandle {
  post(message: HostToWorker): void;
  onMessage(handler: (message: WorkerToHost) => void): void;
  onExit(handler: (reason: string) => void): void;
  /** Stops the Worker; settles once its thread has exited (at once in browsers, which do not
   *  tell). */
  terminate(): Promise<void>;
  /** Node: whether this worker keeps the process alive. Idle workers must not, so a service
   * that never calls `close()` can still exit; a busy one must, or an awaited result is lost. */
  setBusy(busy: boolean): void;
}

/** Imports a Node-only module by a name bundlers leave alone (and, told so, do not warn about). */
export async function nodeImport<T>(name: string): Promise<T> {
  return (await import(/* webpackIgnore: true */ /* @vite-ignore */ name)) as T;
}

async function spawnWorker(workerUrl: string | URL | undefined, wanted: () => boolean): Promise<WorkerHandle> {
  if (isNode) {
    const { Worker } = await nodeImport<typeof import('node:worker_threads')>('node:worker_threads');
    // A pool closed while the module loaded (a lazy start, then close()) gets no thread.
    if (!wanted()) throw new Error('the sandbox was closed');
    // From source (tsx) the script is worker.ts; from the package it is dist/sandbox/worker.js.
    const fromSource = import.meta.url.endsWith('.ts') && !workerUrl;
    const url = workerUrl ?? new URL(/* webpackIgnore: true */ fromSource ? './worker.ts' : './worker.js', import.meta.url);
    const resourceLimits = { maxOldGenerationSizeMb: 64 };
    // Running the TypeScript sources (tests, benchmarks): register the tsx loader in the worker
    // first (Node 20 does not apply `--import` hooks to a worker's entry script).
    const w = fromSource
      ? new Worker(
          `import('tsx/esm/api').then((m) => { m.register(); return import(${JSON.stringify(String(url))}); });`,
          { eval: true, resourceLimits },
        )
      : new Worker(url instanceof URL ? url : new URL(url), { resourceLimits });
    return {
      post: (m) => w.postMessage(m),
      onMessage: (h) => w.on('message', h),
      onExit: (h) => {
        w.on('error', (e) => h(`worker error: ${e instanceof Error ? e.message : String(e)}`));
        w.on('exit', (code) => h(`worker exited with code ${code}`));
      },
      terminate: () => w.terminate().then(
        () => undefined,
        () => undefined,
      ),
      setBusy: (busy) => (busy ? w.ref() : w.unref()),
    };
  }
  // The literal `new URL('./worker.js', import.meta.url)` lets Vite and other bundlers find it.
  const w = workerUrl
    ? new Worker(workerUrl, { type: 'module' })
    : new Worker(new URL('./worker.js', import.meta.url), { type: 'module' });
  const where = workerUrl ? String(workerUrl) : 'the bundled sandbox worker';
  return {
    post: (m) => w.postMessage(m),
    onMessage: (h) => w.addEventListener('message', (e) => h(e.data as WorkerToHost)),
    onExit: (h) => {
      // A script that fails to load or evaluate fires an ErrorEvent without a message.
      w.addEventListener('error', (e) => {
        e.preventDefault();
        h(e.message ? `worker error: ${e.message}` : `the sandbox worker script failed to load or run (${where})`);
      });
      w.addEventListener('messageerror', () => h('a message from the sandbox worker could not be deserialised'));
    },
    terminate: () => {
      w.terminate();
      return Promise.resolve();
    },
    setBusy: () => undefined,
  };
}

const modules = new Map<string, Promise<WebAssembly.Module>>();

/** Compiles the sandbox wasm once per location; the Module is posted to every Worker. */
export function loadSandboxModule(source: SandboxOptions['wasm']): Promise<WebAssembly.Module> {
  if (source instanceof WebAssembly.Module) return Promise.resolve(source);
  // A location given is read as `workerUrl` and `useCoreWasm`'s are, against the page where
  // there is one (a relative path was read against the bundle's folder instead, and missed).
  const base = (globalThis as { location?: { href: string } }).location?.href ?? import.meta.url;
  const url = source ? new URL(/* webpackIgnore: true */ String(source), base) : new URL('../../wasm/crucible_sandbox_bg.wasm', import.meta.url);
  let cached = modules.get(url.href);
  if (!cached) {
    cached = (async () => {
      if (url.protocol === 'file:') {
        const fs = await nodeImport<typeof import('node:fs/promises')>('node:fs/promises');
        return WebAssembly.compile(await fs.readFile(url));
      }
      const response = await fetch(url);
      if (!response.ok) throw new Error(`cannot load sandbox wasm from ${url.href}: HTTP ${response.status}`);
      return WebAssembly.compile(await response.arrayBuffer());
    })();
    modules.set(url.href, cached);
    cached.catch(() => modules.delete(url.href));
  }
  return cached;
}

interface Job {
  id: number;
  request: string;
  /** With the Worker's result as its JSON text, or a failure the pool decided itself. Ends the
   *  job's place in its group (see {@link WorkerPool.release}). */
  resolve: (result: SandboxResult | string) => void;
  started: number;
  group: Group;
  /** Given to a Worker (no longer queued). */
  running: boolean;
  /** Resolved. */
  done: boolean;
}

/**
 * The executions of one code: waiting ones in order, and how many run. Free Workers go to the
 * groups in turns (see {@link WorkerPool.next}), not to the queue's oldest execution: a forge's
 * test cases share one code and arrive together (up to 32), and code that loops for ever would
 * otherwise hold every Worker, deadline after deadline, while any other call (another tool's,
 * another agent's on a shared sandbox) waited behind all of them.
 */
interface Group {
  key: string;
  queue: Job[];
  running: number;
  /** When the group last had a Worker given or given back (or was made): of two groups running
   *  as many executions, the one with the older turn goes first. */
  turn: number;
  /** The agent whose executions these are (see {@link Tenant}). */
  tenant: Tenant;
}

/**
 * The executions of one agent of a sandbox that agents share (`emergent.sandbox`): Workers go
 * to agents in turns first, then to their codes, so an agent whose model floods the sandbox
 * with executions of many different codes (each forge of looping code is a code of its own)
 * takes one turn in each round, as another agent does. Executions made without an agent (a
 * direct `execute`, the agent's own default sandbox) are one tenant, `''`.
 */
interface Tenant {
  key: string;
  /** Executions waiting, in all its groups. */
  queued: number;
  running: number;
  turn: number;
}

/** An execution started on the JSON fast path (see {@link WorkerPool.executeJson}). */
export interface JsonExecution {
  /** The result's JSON text (a {@link SandboxResult}). */
  result: Promise<string>;
  /** Ends the execution as `aborted` (as an aborted signal does); a finished one is left alone. */
  cancel(): void;
}

interface Slot {
  handle: WorkerHandle;
  state: 'starting' | 'idle' | 'busy' | 'dead';
  ready: Promise<void>;
  job: Job | undefined;
  /** A starting Worker's `startTimeoutMs`, the running execution's deadline, or an idle Worker's
   *  `idleTimeoutMs` (a Worker is in one state at a time, and `retire` clears any of them: a
   *  browser's `terminate()` fires no exit event, so a start timer left behind would hold the
   *  dead Worker and its listeners until it fired). */
  timer: ReturnType<typeof setTimeout> | undefined;
  /** The running execution's fetches on the host; dropped (and aborted) when it ends. */
  fetches: HostFetches | undefined;
  /** Failed Worker starts in a row in its position before this one: each position counts its
   *  own, so one position's failures never cut another's (or a retry's) starts short. */
  startFailures: number;
}

/** One execution's fetches on the host: the ones in flight, and the ones waiting for a turn. */
interface HostFetches {
  abort: AbortController;
  active: number;
  waiting: Array<() => void>;
}

/**
 * Fetches of one execution the host runs at once; the others wait in the slot's queue. Each may
 * buffer up to `maxFetchBodyBytes` on the main thread, and the engine allows 16 per execution:
 * run all at once, one execution could hold 16 bodies in host memory.
 */
export const MAX_HOST_FETCHES_PER_EXECUTION = 4;

export interface PoolConfig {
  timeoutMs: number;
  memoryMB: number;
  poolSize: number;
  /** Executions that may wait for a Worker; one more fails with `queue_full`. */
  maxQueued: number;
  fetchDomainAllowlist: string[];
  allowHttp: boolean;
  maxFetchBodyBytes: number;
  workerUrl: string | URL | undefined;
  fetch: typeof globalThis.fetch;
  /** A Worker that has not reported ready by then is discarded as failed. */
  startTimeoutMs: number;
  /** How long a pool whose Workers kept failing to start fails executions at once before an
   *  execution tries to start them again. */
  retryStartAfterMs: number;
  /** How long a Worker may stay idle before it is terminated; an execution that finds no idle
   *  Worker then starts it again (see {@link WorkerPool.wake}). `Infinity`: never. */
  idleTimeoutMs: number;
}

/** Share of the room a Worker had after startup past which it is replaced after an execution
 *  (see {@link WorkerPool.finish}). */
const RECYCLE_AT = 0.5;

/** A Worker's memory when it starts: the instance's initial memory (worker.ts: 256 pages; the
 *  module declares 16 MiB, build.rs). Growth is measured from here, not from zero: at the
 *  minimum budget (32 MB) half the budget is no more than a fresh Worker's size, and every
 *  execution replaced its Worker (20 trivial calls: 20 Workers started, 3.9 s). */
const WORKER_START_BYTES = 16 * 1048576;

/** The memory past which a Worker is replaced after an execution, for a budget of `memoryMB`. */
export function recycleThresholdBytes(memoryMB: number): number {
  return WORKER_START_BYTES + RECYCLE_AT * (memoryMB * 1048576 - WORKER_START_BYTES);
}

/** Consecutive Worker start failures in one pool position after which the pool stops
 *  respawning it (until `retryStartAfterMs` has passed), and with no Worker left fails requests. */
const MAX_START_FAILURES = 3;

export class WorkerPool {
  private readonly slots: Slot[] = [];
  /** Executions waiting or running, grouped by the code they run (see {@link Group}). */
  private readonly groups = new Map<string, Group>();
  /** The agents whose executions are waiting or running (see {@link Tenant}). */
  private readonly tenants = new Map<string, Tenant>();
  /** Executions waiting for a Worker, in all groups. */
  private queued = 0;
  /** Counter of group turns (see {@link Group.turn}). */
  private turns = 0;
  private nextId = 1;
  private closed = false;
  /** Set when Workers keep failing to start: the reason every request now fails with, until
   *  `retryStartAfterMs` after `vacatedAt`. */
  private broken: string | undefined;
  /** Pool positions left empty after their Workers kept failing to start (or could not be
   *  created), which nothing is filling: started again after `retryStartAfterMs`. */
  private readonly vacant = new Set<number>();
  /** When a position was last left empty. */
  private vacatedAt = 0;
  /** Pool positions whose Worker was retired after `idleTimeoutMs` idle (no failure: nothing
   *  counts against starts), started again by {@link wake}. */
  private readonly retired = new Set<number>();
  /** Workers {@link wake} started that have not yet reported ready (or failed). */
  private waking = 0;
  /** Whether the Workers were asked to start (by `start`, or by the first execution). */
  private started = false;
  /** Started by an execution (`lazy`), not by `start`. */
  private startedOnDemand = false;
  /** Whether any Worker of this pool has reported ready. */
  private everReady = false;
  /** Number of the current on-demand start: Workers of a start that failed are not kept. */
  private attempt = 0;
  private readonly counters: Omit<SandboxStats, 'workers'> = { workersStarted: 0, workersKilled: 0, workersRecycled: 0, workersRetired: 0, lastReplacementMs: undefined };
  /**
   * Workers being terminated, and Workers being created (a closed pool terminates each as soon
   * as it exists): `close()` waits for all of them, so a closed sandbox has no thread left
   * (each holds ~26 MB, and Node counts one that is terminating as keeping the process alive).
   */
  private readonly exiting = new Set<Promise<void>>();

  constructor(
    private readonly module: WebAssembly.Module,
    private readonly config: PoolConfig,
  ) {}

  /** Starts the Workers now and waits until they are ready (or one fails). A pool never
   *  started this way starts them on its first execution. */
  async start(): Promise<void> {
    this.started = true;
    const slots = await Promise.all(Array.from({ length: this.config.poolSize }, () => this.spawn()));
    this.slots.push(...slots);
    await Promise.all(slots.map((s) => s.ready));
  }

  /** The first execution's start: jobs wait in the queue until a Worker is ready. */
  private startOnDemand(): void {
    if (this.started) return;
    this.started = this.startedOnDemand = true;
    const attempt = ++this.attempt;
    for (let i = 0; i < this.config.poolSize; i++) {
      this.spawn().then(
        (slot) => (this.closed || attempt !== this.attempt ? this.retire(slot) : void this.slots.push(slot)),
        (error: unknown) => this.onDemandStartFailed(attempt, error instanceof Error ? error.message : String(error)),
      );
    }
  }

  /**
   * A Worker of an on-demand start failed before any ever became ready: as `createSandbox`
   * fails when an eager start does, the executions waiting for it fail at once (instead of
   * after every respawn's start timeout), and the next execution starts afresh.
   */
  private onDemandStartFailed(attempt: number, reason: string): void {
    if (this.closed || attempt !== this.attempt || this.everReady) return;
    this.attempt++;
    this.started = false;
    for (const slot of this.slots) this.retire(slot);
    this.slots.length = 0;
    this.vacant.clear();
    this.failQueued('worker_start', `the sandbox workers failed to start (${reason})`);
  }

  /** Ends every execution waiting for a Worker with `code`. */
  private failQueued(code: 'worker_start' | 'closed', message: string): void {
    const jobs = [...this.groups.values()].flatMap((group) => group.queue).sort((a, b) => a.id - b.id);
    for (const job of jobs) job.resolve(failure('error', code, message, job.started));
  }

  stats(): SandboxStats {
    return { ...this.counters, workers: this.slots.filter((s) => s.state !== 'dead').length };
  }

  execute(request: SandboxRequest, options?: ExecuteOptions): Promise<SandboxResult> {
    const started = performance.now();
    const refused = (message: string) => Promise.resolve(failure('rejected', 'bad_request', message, started));
    // Read once, and here: a getter or Proxy trap that throws fails this execution through its
    // promise, as any bad request does, instead of throwing where `execute` was called.
    let signal: AbortSignal | undefined;
    let alreadyAborted: boolean | undefined;
    try {
      signal = options?.signal ?? undefined;
      // `null` counts as no signal, as `undefined` does.
      if (signal !== undefined && typeof (signal as { addEventListener?: unknown }).addEventListener !== 'function') return refused('options.signal must be an AbortSignal');
      alreadyAborted = signal?.aborted;
    } catch (error) {
      return refused(`the options could not be read: ${messageOf(error)}`);
    }
    if (alreadyAborted) return Promise.resolve(aborted(started));
    let code: unknown;
    let input: unknown;
    let allowlist: unknown;
    try {
      ({ code, input, allowlist } = request ?? ({} as Partial<SandboxRequest>));
    } catch (error) {
      return refused(`the request could not be read: ${messageOf(error)}`);
    }
    if (typeof code !== 'string') return refused('request.code must be a string');
    // The Worker reads the request with serde: a field it cannot read would come back as a
    // failed execution naming a position in JSON text nobody wrote.
    allowlist ??= [];
    // Array.from: a hole of a sparse array is an entry too (every() skips holes).
    if (!Array.isArray(allowlist) || !Array.from(allowlist).every((api) => typeof api === 'string')) {
      return refused(`request.allowlist must be an array of host API names ('fetch', 'crypto'), got ${describeValue(allowlist)}`);
    }
    let json: string;
    try {
      const inputJson = JSON.stringify(input ?? null) as string | undefined;
      // A function or a symbol: JSON.stringify writes nothing, and the field would be missing.
      if (inputJson === undefined) return refused(`request.input has no JSON form (got ${typeof input})`);
      json = `{"code":${JSON.stringify(code)},"input":${inputJson},"allowlist":${JSON.stringify(allowlist)}}`;
    } catch (error) {
      return refused(`input is not JSON-serialisable: ${String(error)}`);
    }
    return new Promise((settle) => {
      let job: Job | undefined;
      const onAbort = () => job && this.abandon(job);
      job = this.submit(json, code, started, (result) => {
        signal?.removeEventListener('abort', onAbort);
        if (typeof result !== 'string') return settle(result);
        let parsed: SandboxResult;
        try {
          parsed = JSON.parse(result) as SandboxResult;
        } catch {
          return settle(failure('error', 'internal', 'malformed result from the sandbox worker', started));
        }
        parsed.durationMs = performance.now() - started;
        settle(parsed);
      });
      if (job) signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  /**
   * The agent core's way in: the request as the JSON text the Worker reads, the result as the
   * JSON text it writes, and a `cancel` instead of an `AbortSignal`, so an execution costs no
   * parse and stringify on either side and no `AbortController`. The core finds it under
   * `Symbol.for('crucible.sandbox.executeJson')` on the sandbox `createSandbox` returns.
   */
  executeJson(requestJson: string, tenant = ''): JsonExecution {
    const started = performance.now();
    let job: Job | undefined;
    const result = new Promise<string>((settle) => {
      job = this.submit(requestJson, codeOf(requestJson), started, (r) => settle(typeof r === 'string' ? r : JSON.stringify(r)), tenant);
    });
    return { result, cancel: () => job && this.abandon(job) };
  }

  /** Queues an execution of `json` in the group of `code`, or ends it at once (closed, broken,
   *  queue full); the job when it was queued. */
  private submit(json: string, code: string, started: number, resolve: Job['resolve'], tenantKey = ''): Job | undefined {
    const refuse = (result: SandboxResult) => {
      resolve(result);
      return undefined;
    };
    if (this.closed) return refuse(failure('error', 'closed', 'the sandbox is closed', started));
    // A pool that gave up fails at once until then; one with a Worker left serves meanwhile.
    if (this.broken || this.vacant.size > 0) {
      const waited = performance.now() - this.vacatedAt >= this.config.retryStartAfterMs;
      if (this.broken && !waited) return refuse(failure('error', 'worker_start', this.broken, started));
      if (waited) this.retryStart();
    }
    // A flood of executions (many runs, each with many calls) must not pile up without bound:
    // each waiting job holds its request, and the last would wait behind all the others. Until
    // a Worker was ever ready (a lazy pool's first start), the pool's Workers count as free;
    // after, the ones retired for idleness and being started again (see wake) do.
    const idle = this.slots.some((s) => s.state === 'idle');
    if (!idle && this.queued >= this.config.maxQueued + (this.everReady ? this.retired.size + this.waking : this.config.poolSize)) {
      return refuse(
        failure('error', 'queue_full', `${this.queued} executions are already waiting for a sandbox worker (maxQueued ${this.config.maxQueued}); try again later`, started),
      );
    }
    let tenant = this.tenants.get(tenantKey);
    // One agent of several never takes more than half the places: another always finds room.
    const share = Math.max(1, Math.floor(this.config.maxQueued / 2));
    if (tenantKey !== '' && tenant && tenant.queued >= share) {
      return refuse(
        failure('error', 'queue_full', `this agent's ${tenant.queued} executions already wait for a worker of this shared sandbox (at most half of maxQueued ${this.config.maxQueued} per agent); try again later`, started),
      );
    }
    if (!tenant) {
      tenant = { key: tenantKey, queued: 0, running: 0, turn: ++this.turns };
      this.tenants.set(tenantKey, tenant);
    }
    const groupKey = tenantKey === '' ? code : `${tenantKey}\u0000${code}`;
    let group = this.groups.get(groupKey);
    if (!group) {
      group = { key: groupKey, queue: [], running: 0, turn: ++this.turns, tenant };
      this.groups.set(groupKey, group);
    }
    const job: Job = {
      id: this.nextId++,
      request: json,
      resolve: (result) => {
        this.release(job);
        resolve(result);
      },
      started,
      group,
      running: false,
      done: false,
    };
    group.queue.push(job);
    tenant.queued++;
    this.queued++;
    this.startOnDemand();
    this.wake();
    this.pump();
    return job;
  }

  /**
   * Starts Workers again in the positions retired for idleness, when an execution finds no
   * idle Worker: as a lazy pool's first execution starts its Workers, and through the path a
   * replacement takes (a Worker that then fails to start counts as any failed start does).
   */
  private wake(): void {
    if (this.retired.size === 0 || this.slots.some((s) => s.state === 'idle')) return;
    const positions = [...this.retired];
    this.retired.clear();
    const woken = () => void this.waking--;
    for (const index of positions) {
      this.waking++;
      this.spawnAt(index)
        .then((fresh) => fresh?.ready)
        .then(woken, woken);
    }
  }

  /** Ends `job` as aborted: dropped from the queue, or its Worker terminated and replaced
   *  (an execution cannot be interrupted any other way). A finished job is left alone. */
  private abandon(job: Job): void {
    if (job.done) return;
    if (job.running) {
      const slot = this.slots.find((s) => s.job === job);
      if (!slot) return;
      this.replace(slot);
    }
    job.resolve(aborted(job.started));
  }

  /** The next execution to give a Worker: the oldest of the group running the fewest, of
   *  those with as few the one whose turn is oldest. A group that just had a Worker back (its
   *  execution ended, a deadline included) goes after one that waited meanwhile, so another
   *  code's execution waits for at most one Worker to come free, not for every execution
   *  queued before it. */
  private next(): Job | undefined {
    const fewer = (a: { running: number; turn: number }, b: { running: number; turn: number } | undefined) =>
      !b || a.running < b.running || (a.running === b.running && a.turn < b.turn);
    // The agent first (see Tenant), then its code.
    let tenant: Tenant | undefined;
    for (const t of this.tenants.values()) if (t.queued > 0 && fewer(t, tenant)) tenant = t;
    if (!tenant) return undefined;
    let best: Group | undefined;
    for (const group of this.groups.values()) {
      if (group.tenant !== tenant || group.queue.length === 0) continue;
      if (fewer(group, best)) best = group;
    }
    if (!best) return undefined;
    const job = best.queue.shift()!;
    this.queued--;
    tenant.queued--;
    tenant.running++;
    tenant.turn = ++this.turns;
    best.running++;
    best.turn = ++this.turns;
    job.running = true;
    return job;
  }

  /** A job ended (any way): it leaves its group's queue or gives its Worker back; a group with
   *  nothing waiting or running is dropped. */
  private release(job: Job): void {
    if (job.done) return;
    job.done = true;
    const group = job.group;
    const tenant = group.tenant;
    if (job.running) {
      group.running--;
      group.turn = ++this.turns;
      tenant.running--;
      tenant.turn = ++this.turns;
    } else {
      const at = group.queue.indexOf(job);
      if (at >= 0) {
        group.queue.splice(at, 1);
        this.queued--;
        tenant.queued--;
      }
    }
    if (group.running === 0 && group.queue.length === 0 && this.groups.get(group.key) === group) this.groups.delete(group.key);
    if (tenant.running === 0 && tenant.queued === 0 && this.tenants.get(tenant.key) === tenant) this.tenants.delete(tenant.key);
  }

  async close(): Promise<void> {
    this.closed = true;
    this.failQueued('closed', 'the sandbox was closed');
    for (const slot of this.slots) {
      if (slot.job) slot.job.resolve(failure('error', 'closed', 'the sandbox was closed', slot.job.started));
      this.retire(slot);
    }
    this.slots.length = 0;
    // A Worker created meanwhile is retired by whoever awaited its creation, which adds its
    // termination here before the wait below ends: wait until nothing is left.
    while (this.exiting.size > 0) await Promise.all(this.exiting);
  }

  /** Counts `work` (a Worker's creation or termination) in {@link exiting} until it settles. */
  private track(work: Promise<unknown>): void {
    const settled: Promise<void> = work.then(
      () => void this.exiting.delete(settled),
      () => void this.exiting.delete(settled),
    );
    this.exiting.add(settled);
  }

  /** Creates a Worker whose position has seen `startFailures` failed starts in a row. */
  private spawn(startFailures = 0): Promise<Slot> {
    const spawning = this.create(startFailures);
    this.track(spawning);
    return spawning;
  }

  private async create(startFailures: number): Promise<Slot> {
    const handle = await spawnWorker(this.config.workerUrl, () => !this.closed);
    this.counters.workersStarted++;
    let markReady!: () => void;
    let markFailed!: (e: Error) => void;
    const slot: Slot = {
      handle,
      state: 'starting',
      ready: new Promise<void>((res, rej) => {
        markReady = res;
        markFailed = rej;
      }),
      job: undefined,
      timer: undefined,
      fetches: undefined,
      startFailures,
    };
    slot.ready.catch(() => {});
    // A Worker that never answers (a wrong script, a Module the browser would not deliver)
    // must not hang createSandbox or a replacement forever.
    slot.timer = setTimeout(() => {
      if (slot.state !== 'starting') return;
      const reason = `the sandbox worker did not start within ${this.config.startTimeoutMs} ms`;
      markFailed(new Error(reason));
      this.startFailed(slot, reason);
    }, this.config.startTimeoutMs);
    (slot.timer as { unref?: () => void }).unref?.();
    const clearStartTimer = () => {
      if (slot.state === 'starting') clearTimeout(slot.timer);
    };
    handle.onMessage((message) => {
      switch (message.type) {
        case 'ready':
          clearStartTimer();
          if (slot.state !== 'starting') return;
          slot.state = 'idle';
          this.broken = undefined;
          this.everReady = true;
          markReady();
          this.pump();
          this.rest(slot);
          return;
        case 'init-error':
          clearStartTimer();
          markFailed(new Error(`sandbox worker failed to start: ${message.message}`));
          this.startFailed(slot, `sandbox worker failed to start: ${message.message}`);
          return;
        case 'result':
          return this.finish(slot, message.id, message.result, message.memoryBytes);
        case 'trap':
          return this.onTrap(slot, message);
        case 'fetch':
          return this.onFetch(slot, message.id, message.request);
      }
    });
    handle.onExit((reason) => {
      clearStartTimer();
      if (slot.state === 'dead') return;
      markFailed(new Error(reason));
      if (slot.state === 'starting') return this.startFailed(slot, reason);
      const job = slot.job;
      this.replace(slot);
      if (job) job.resolve(failure('error', 'worker_exit', reason, job.started));
    });
    const limits = JSON.stringify({ timeoutMs: this.config.timeoutMs, memoryMB: this.config.memoryMB, maxFetchBodyBytes: this.config.maxFetchBodyBytes });
    handle.post({ type: 'init', module: this.module, memoryMB: this.config.memoryMB, limits });
    return slot;
  }

  private pump(): void {
    if (this.closed) return;
    for (const slot of this.slots) {
      if (this.queued === 0) return;
      if (slot.state !== 'idle') continue;
      const job = this.next();
      if (!job) return;
      slot.state = 'busy';
      slot.job = job;
      clearTimeout(slot.timer);
      slot.timer = setTimeout(() => this.onDeadline(slot), this.config.timeoutMs);
      slot.handle.setBusy(true);
      slot.handle.post({ type: 'execute', id: job.id, request: job.request });
    }
  }

  /**
   * Ends the slot's job with the Worker's result text. A Worker whose instance has used more than
   * half the room it had after startup ({@link recycleThresholdBytes}) is then replaced rather
   * than reused: a wasm memory never shrinks, and
   * some engine state outlives executions (Boa's global symbol registry, its string interner),
   * so a long-lived Worker would otherwise fail some later, innocent execution with `memory`.
   */
  private finish(slot: Slot, id: number, result: string, memoryBytes = 0): void {
    const job = slot.job;
    if (!job || job.id !== id) return;
    clearTimeout(slot.timer);
    slot.job = undefined;
    dropFetches(slot);
    slot.state = 'idle';
    job.resolve(result);
    if (memoryBytes > recycleThresholdBytes(this.config.memoryMB)) this.replace(slot, 'recycled');
    this.pump();
    this.rest(slot);
  }

  /** A Worker left with nothing to run: it no longer keeps the process alive, and is retired
   *  after `idleTimeoutMs` unless an execution takes it first. The timer does not keep the
   *  process alive either (in Node; browsers have nothing to unref). */
  private rest(slot: Slot): void {
    if (slot.state !== 'idle') return;
    slot.handle.setBusy(false);
    if (this.config.idleTimeoutMs === Infinity) return;
    clearTimeout(slot.timer);
    slot.timer = setTimeout(() => this.retireIdle(slot), this.config.idleTimeoutMs);
    (slot.timer as { unref?: () => void }).unref?.();
  }

  /** Terminates a Worker that stayed idle for `idleTimeoutMs` and leaves its position to
   *  {@link wake}. An execution given it meanwhile made it busy and cleared this timer; the
   *  state is checked all the same, as a due timer's callback may already be queued. */
  private retireIdle(slot: Slot): void {
    const index = this.slots.indexOf(slot);
    if (slot.state !== 'idle' || this.closed || index < 0) return;
    this.retire(slot);
    this.counters.workersRetired++;
    this.retired.add(index);
  }

  private onDeadline(slot: Slot): void {
    const job = slot.job;
    if (!job) return;
    this.replace(slot);
    job.resolve(failure('timeout', 'deadline', `execution exceeded ${this.config.timeoutMs} ms; the worker was terminated`, job.started));
  }

  private onTrap(slot: Slot, trap: Extract<WorkerToHost, { type: 'trap' }>): void {
    // A trap the Worker reports outside the current execution (`id` of an earlier one, or
    // none: a late failure after its result) is not the current job's doing. The Worker is
    // replaced all the same, so that job ends as a worker exit, not as the trap's outcome.
    const job = trap.id !== undefined && trap.id === slot.job?.id ? slot.job : undefined;
    const orphan = job === undefined ? slot.job : undefined;
    this.replace(slot);
    if (orphan) orphan.resolve(failure('error', 'worker_exit', 'the sandbox worker failed after an earlier execution; it was replaced', orphan.started));
    if (!job) return;
    const nearCap = trap.memoryBytes >= this.config.memoryMB * 1048576 * 0.9;
    const memory = trap.allocationFailed || (nearCap && /unreachable/i.test(trap.message));
    if (memory) {
      job.resolve(failure('memory', 'out_of_memory', `the execution exceeded the ${this.config.memoryMB} MB memory budget; the instance was discarded`, job.started));
    } else if (/call stack|too much recursion|memory access out of bounds|out of bounds memory access|index out of bounds/i.test(trap.message)) {
      // Two stacks can run out: the engine's native one ("Maximum call stack size exceeded",
      // Firefox's "too much recursion") and the Rust stack inside the instance, which the linker
      // puts first in its memory, so overflowing it reads below address 0: an out-of-bounds
      // access (V8, Safari and Firefox each word it their way). Source
      // nested past what the validator counts (its scan does not know regex literals) hits
      // either one, by how far the engine's code has tiered up, and is the same failure.
      job.resolve(failure('error', 'stack_overflow', 'the engine ran out of stack (deep recursion, or source nested too deeply); the instance was discarded', job.started));
    } else {
      // Neither memory nor stack: a fault inside the engine (a Boa bug this code reaches, such
      // as its ArrayBuffer.prototype.slice on a buffer the arguments shrink). Contained all the
      // same: the Rust bounds check stopped it, and the instance goes.
      job.resolve(failure('error', 'trap', `the sandbox's JavaScript engine failed on this code (${trap.message.slice(0, 200)}: an internal error of the engine, not of the code's own making); the instance was discarded`, job.started));
    }
  }

  /** Runs a fetch of the slot's execution, or queues it while {@link MAX_HOST_FETCHES_PER_EXECUTION} are out. */
  private onFetch(slot: Slot, id: number, request: string): void {
    if (!slot.job || slot.state !== 'busy') return;
    const fetches = (slot.fetches ??= { abort: new AbortController(), active: 0, waiting: [] });
    const run = () => {
      fetches.active++;
      bridgedFetch(request, {
        allowlist: this.config.fetchDomainAllowlist,
        allowHttp: this.config.allowHttp,
        maxBodyBytes: this.config.maxFetchBodyBytes,
        maxRedirects: 5,
        fetch: this.config.fetch,
        signal: fetches.abort.signal,
      })
        .then(
          (payload) => ({ type: 'fetch-result' as const, id, ok: true, payload }),
          (error: unknown) => ({ type: 'fetch-result' as const, id, ok: false, payload: error instanceof Error ? error.message : 'fetch failed' }),
        )
        .then((result) => {
          // An execution that has ended took its fetches with it (see dropFetches).
          if (slot.fetches !== fetches) return;
          fetches.active--;
          slot.handle.post(result);
          fetches.waiting.shift()?.();
        });
    };
    if (fetches.active < MAX_HOST_FETCHES_PER_EXECUTION) run();
    else fetches.waiting.push(run);
  }

  private retire(slot: Slot): void {
    clearTimeout(slot.timer);
    dropFetches(slot);
    slot.state = 'dead';
    slot.job = undefined;
    this.track(slot.handle.terminate());
  }

  /**
   * A Worker failed before it was ready: replace it, unless starts keep failing — then stop
   * respawning (no crash loop) and fail queued and later requests with the reason.
   */
  private startFailed(slot: Slot, reason: string): void {
    if (slot.state === 'dead') return;
    if (this.startedOnDemand && !this.everReady) return this.onDemandStartFailed(this.attempt, reason);
    const failures = slot.startFailures + 1;
    if (failures < MAX_START_FAILURES) {
      this.replace(slot, 'killed', failures);
      return;
    }
    this.retire(slot);
    this.vacate(this.slots.indexOf(slot));
    this.giveUpUnless(this.slots.some((s) => s.state === 'idle' || s.state === 'busy'), reason);
  }

  /** After a position was left empty: gives up unless Workers can still serve, `alive` ones or
   *  positions retired for idleness (or being started again). Those are started as an
   *  execution would (at once when executions wait): no failure of theirs was seen, and a pool
   *  given up for good (`retryStartAfterMs: Infinity`) would refuse every execution while they
   *  could serve. */
  private giveUpUnless(alive: boolean, reason: string): void {
    if (this.retired.size > 0 || this.waking > 0) {
      if (this.queued > 0) this.wake();
      return;
    }
    if (!alive) this.giveUp(reason);
  }

  /** Leaves pool position `index` empty until {@link retryStart}. */
  private vacate(index: number): void {
    if (index >= 0) this.vacant.add(index);
    this.vacatedAt = performance.now();
  }

  /** Stops starting Workers: queued requests, and later ones for `retryStartAfterMs`, fail
   *  with `reason`. */
  private giveUp(reason: string): void {
    if (this.closed) return;
    this.broken = `sandbox workers keep failing to start (${reason})`;
    this.failQueued('worker_start', this.broken);
  }

  /**
   * Starts Workers again in the empty positions, whether the pool gave up or other Workers
   * went on serving: what kept them from starting (memory, a file being replaced, a network
   * blip for a remote script) may have passed, and a long-running service should not need a
   * restart to find out, nor run on fewer Workers for good. Each position starts from a fresh
   * count: one transient failure is replaced as in a working pool, and only as many failures
   * in a row as gave the position up leave it empty (and a pool with no Worker left given up)
   * for another period. Only vacant positions: one whose replacement is being created would
   * get two Workers, the first never terminated.
   */
  private retryStart(): void {
    this.broken = undefined;
    const vacant = [...this.vacant];
    this.vacant.clear();
    for (const index of vacant) void this.spawnAt(index);
  }

  /** Discards a Worker (killed: it failed or ran out of time; recycled: it grew) and starts
   *  its replacement in the same pool position, after `startFailures` failed starts there. */
  private replace(slot: Slot, why: 'killed' | 'recycled' = 'killed', startFailures = 0): void {
    if (slot.state === 'dead') return;
    this.retire(slot);
    if (why === 'killed') this.counters.workersKilled++;
    else this.counters.workersRecycled++;
    if (this.closed) return;
    const killedAt = performance.now();
    void this.spawnAt(this.slots.indexOf(slot), startFailures).then((fresh) =>
      fresh?.ready.then(
        () => {
          this.counters.lastReplacementMs = performance.now() - killedAt;
        },
        () => {},
      ),
    );
  }

  /** Starts a Worker in pool position `index` (past the end: a new position); the Worker, or
   *  `undefined` when the pool closed meanwhile or none could be created. */
  private spawnAt(index: number, startFailures = 0): Promise<Slot | undefined> {
    return this.spawn(startFailures).then(
      (fresh) => {
        if (this.closed) return void this.retire(fresh);
        if (index >= 0) this.slots[index] = fresh;
        else this.slots.push(fresh);
        return fresh;
      },
      // A Worker that cannot even be created leaves its position empty: with no other Worker
      // alive, nothing would ever take the queued jobs.
      (error: unknown) => {
        this.vacate(index);
        this.giveUpUnless(this.slots.some((s) => s.state !== 'dead'), error instanceof Error ? error.message : String(error));
        return undefined;
      },
    );
  }
}

/**
 * The code a request's JSON text runs, as the key of its group. Requests are written with
 * `code` first (`execute` above, the core's `SandboxRequest`), so it is read as the string
 * after `{"code":"` (still escaped: the same code gives the same text) without parsing the
 * input; any other text is parsed. A key that differs for the same code only splits a group.
 */
export function codeOf(json: string): string {
  const head = '{"code":"';
  if (json.startsWith(head)) {
    for (let at = json.indexOf('"', head.length); at >= 0; at = json.indexOf('"', at + 1)) {
      let backslashes = 0;
      while (json.charCodeAt(at - 1 - backslashes) === 92) backslashes++;
      if (backslashes % 2 === 0) return json.slice(head.length, at);
    }
  }
  try {
    const code = (JSON.parse(json) as { code?: unknown } | null)?.code;
    return typeof code === 'string' ? code : json;
  } catch {
    return json;
  }
}

/** Aborts the fetches of the slot's execution still in flight and forgets the waiting ones. */
function dropFetches(slot: Slot): void {
  slot.fetches?.abort.abort();
  slot.fetches = undefined;
}

function aborted(started: number): SandboxResult {
  return failure('error', 'aborted', 'the execution was aborted', started);
}

function failure(status: SandboxResult['status'], code: string, message: string, started: number): SandboxResult {
  return { status, error: { code, message }, logs: [], durationMs: performance.now() - started };
}

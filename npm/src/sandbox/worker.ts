/**
 * The sandbox Worker: one `crucible_sandbox` wasm instance with a capped `WebAssembly.Memory`.
 * Runs in Node `worker_threads` and in browser Web Workers (module workers). It executes one
 * request at a time; on a trap it reports and stops serving (the host terminates it).
 */
import { initSync, init, execute, allocationFailed } from '../../wasm/crucible_sandbox.js';
import type { HostToWorker, WorkerToHost } from './protocol.js';

interface Port {
  post(message: WorkerToHost): void;
  onMessage(handler: (message: HostToWorker) => void): void;
}

async function port(): Promise<Port> {
  const isNode = typeof process !== 'undefined' && !!process.versions?.node && typeof (globalThis as { WorkerGlobalScope?: unknown }).WorkerGlobalScope === 'undefined';
  if (isNode) {
    const name = 'node:worker_threads';
    const { parentPort } = (await import(/* webpackIgnore: true */ /* @vite-ignore */ name)) as typeof import('node:worker_threads');
    if (!parentPort) throw new Error('sandbox worker must run in a worker thread');
    return {
      post: (m) => parentPort.postMessage(m),
      onMessage: (h) => {
        parentPort.on('message', h);
        parentPort.on('messageerror', () => undelivered());
      },
    };
  }
  const scope = globalThis as unknown as { postMessage(m: unknown): void; addEventListener(t: string, h: (e: MessageEvent) => void): void };
  return {
    post: (m) => scope.postMessage(m),
    onMessage: (h) => {
      scope.addEventListener('message', (e) => h(e.data as HostToWorker));
      scope.addEventListener('messageerror', () => undelivered());
    },
  };
}

/** A host message this Worker could not deserialise (e.g. a WebAssembly.Module a browser
 * will not share with it): report it instead of waiting silently for ever. */
function undelivered(): void {
  if (memory === undefined) p?.post({ type: 'init-error', message: 'the init message (the compiled sandbox module) could not be received by the worker' });
  else trap(new Error('a message from the host could not be deserialised'));
}

// No top-level await: bundlers (Vite) emit workers as classic scripts by default. Messages
// sent before the listener exists are queued by the port (Node) or arrive after this
// evaluation's microtasks (browsers).
let p: Port | undefined;
void port().then((ready) => {
  p = ready;
  ready.onMessage(handle);
});
let memory: WebAssembly.Memory | undefined;
let current: number | undefined;
let dead = false;
let nextFetch = 1;
const fetches = new Map<number, { resolve: (v: string) => void; reject: (e: Error) => void }>();

function trap(error: unknown): void {
  if (dead) return;
  dead = true;
  let failed = false;
  try {
    failed = allocationFailed();
  } catch {
    failed = false;
  }
  p?.post({
    type: 'trap',
    id: current,
    message: error instanceof Error ? `${error.name}: ${error.message}` : String(error),
    allocationFailed: failed,
    memoryBytes: memory?.buffer.byteLength ?? 0,
  });
}

// A trap inside a wasm-bindgen-futures poll surfaces as an uncaught error, not a rejection.
if (typeof process !== 'undefined' && typeof process.on === 'function' && typeof (globalThis as { WorkerGlobalScope?: unknown }).WorkerGlobalScope === 'undefined') {
  process.on('uncaughtException', trap);
  process.on('unhandledRejection', trap);
} else {
  (globalThis as unknown as { addEventListener(t: string, h: (e: { error?: unknown; reason?: unknown; preventDefault(): void }) => void): void })
    .addEventListener('error', (e) => { e.preventDefault(); trap(e.error); });
  (globalThis as unknown as { addEventListener(t: string, h: (e: { reason?: unknown; preventDefault(): void }) => void): void })
    .addEventListener('unhandledrejection', (e) => { e.preventDefault(); trap(e.reason); });
}

function bridgeFetch(requestJson: string): Promise<string> {
  const id = nextFetch++;
  return new Promise((resolve, reject) => {
    fetches.set(id, { resolve, reject });
    p?.post({ type: 'fetch', id, request: requestJson });
  });
}

function handle(message: HostToWorker): void {
  if (dead || !p) return;
  const out = p;
  switch (message.type) {
    case 'init': {
      try {
        // 64 KiB pages; the module declares a 16 MiB minimum (build.rs).
        memory = new WebAssembly.Memory({ initial: 256, maximum: Math.max(256, message.memoryMB * 16) });
        initSync({ module: message.module, memory });
        init(message.limits, bridgeFetch);
        out.post({ type: 'ready' });
      } catch (error) {
        out.post({ type: 'init-error', message: error instanceof Error ? error.message : String(error) });
      }
      return;
    }
    case 'execute': {
      // Fetches of an earlier execution that were still out are no longer anyone's: their
      // results (if the host sends any) find no waiter.
      fetches.clear();
      current = message.id;
      let pending: Promise<string>;
      try {
        pending = execute(message.request);
      } catch (error) {
        trap(error);
        return;
      }
      pending.then(
        (result) => {
          if (dead) return;
          current = undefined;
          out.post({ type: 'result', id: message.id, result, memoryBytes: memory?.buffer.byteLength ?? 0 });
        },
        (error) => trap(error),
      );
      return;
    }
    case 'fetch-result': {
      const waiter = fetches.get(message.id);
      if (!waiter) return;
      fetches.delete(message.id);
      if (message.ok) waiter.resolve(message.payload);
      else waiter.reject(new Error(message.payload));
      return;
    }
  }
}

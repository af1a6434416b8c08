/**
 * What ties an agent to the world outside it, from `createAgent` to `close()`: its registry's
 * claim on the store, the store's other agents sharing the `shared` tier (and other tabs',
 * through a `BroadcastChannel`), the stats flush when a page is left, and the release that lets
 * go of all of it.
 */
import { AbortError, CrucibleError, StoreError } from '../errors.js';
import type { Store } from '../stores/types.js';
import type { SandboxHost } from './agent-options.js';
import type { CoreAgentHandle } from './core-handle.js';
import { closedWhileCalling } from './waiting-calls.js';

/**
 * Agents created with the same `store` object form one runtime: they share the `shared` tier.
 * A shared-tier change made through one agent (approve, demote, rollback) is re-read by the
 * others at once; agents in other tabs hear of it on the store's `broadcastName` (see
 * `sharedTierChannel`), agents in other processes see it when they load.
 */
const runtimes = new WeakMap<object, Set<CoreAgentHandle>>();

/** Agent ids with emergent capabilities open on each store object in this context. */
const openRegistries = new WeakMap<object, Set<string>>();

/** Lets go of what an agent dropped without `close()` held outside itself, once it is
 *  garbage-collected (when is up to the engine): its registry claim, so its id can be opened
 *  again; the sandbox Workers it started (about 28 MB each); its place among the store's
 *  agents and its listeners, which would keep its core (and its wasm memory) for good. */
export const unclosedAgents = new FinalizationRegistry<() => void>((release) => release());

/**
 * Claims `agentId` on `store` for one open agent with emergent capabilities: its registry keeps
 * its tools, stats and audit trail in memory and writes them back, so a second writer of the
 * same records (another agent object here, or another tab) would overwrite them. Refused with
 * `store_blocked` when taken; resolves with the release function. `openRegistries` is per store
 * object, enough where each object owns its data (memory, LevelDB); stores whose objects share
 * data (IndexedDB) take `agent:<agentId>` with `tryLock`, which spans all of them.
 */
export async function claimRegistry(store: Store, agentId: string): Promise<() => void> {
  const open = openRegistries.get(store) ?? new Set<string>();
  if (open.has(agentId)) {
    throw new StoreError('store_blocked', `agent "${agentId}" already has emergent capabilities open on this store: close it first, or give this agent another agentId`);
  }
  const releaseLock = store.tryLock ? await store.tryLock(`agent:${agentId}`) : () => undefined;
  if (!releaseLock) {
    throw new StoreError('store_blocked', `agent "${agentId}" is already open on this store (in another tab or worker, or through another store object on the same database): close it there, or give this agent another agentId`);
  }
  open.add(agentId);
  openRegistries.set(store, open);
  return () => {
    open.delete(agentId);
    releaseLock();
  };
}

export async function reloadSharedTier(store: object | undefined, changedBy: CoreAgentHandle): Promise<void> {
  const agents = store ? runtimes.get(store) : undefined;
  if (!agents) return;
  // Best effort: a sibling that cannot read the store keeps its tier until it loads again.
  await Promise.all([...agents].filter((a) => a !== changedBy).map((a) => a.reloadShared().catch(() => undefined)));
}

/** The message agents post on their store's `broadcastName` after changing the shared tier. */
const SHARED_TIER_CHANGED = 'crucible:shared-tier-changed';

/**
 * Listens on the store's `broadcastName` (other tabs and workers opening the same data) and
 * re-reads the shared tier when one of their agents changed it. `undefined` when the store
 * has no such name or the platform has no `BroadcastChannel`.
 */
function sharedTierChannel(store: Store | undefined, core: CoreAgentHandle): BroadcastChannel | undefined {
  const name = store?.broadcastName;
  if (!name || typeof BroadcastChannel === 'undefined' || !core.emergentEnabled) return undefined;
  const channel = new BroadcastChannel(name);
  channel.onmessage = (event: MessageEvent) => {
    if (event.data === SHARED_TIER_CHANGED) void core.reloadShared().catch(() => undefined);
  };
  // Node: a listening channel must not keep a service alive on its own.
  (channel as { unref?: () => void }).unref?.();
  return channel;
}

/**
 * Tells agents in other tabs and workers that this agent changed the shared tier. The agent
 * may have been closed while the change was written (its channel closed with it): the change
 * is in the store all the same, so they are told through a channel opened for the message.
 */
export function announceSharedTierChange(channel: BroadcastChannel | undefined, name: string | undefined): void {
  if (!channel || !name) return;
  try {
    channel.postMessage(SHARED_TIER_CHANGED);
  } catch {
    const once = new BroadcastChannel(name);
    once.postMessage(SHARED_TIER_CHANGED);
    once.close(); // what it posted is delivered all the same
  }
}

/**
 * In a page, writes the agent's buffered tool stats when the page is left: stats go to the
 * store every 16 calls, at `endSession` and at `close()`, and a page reloaded, navigated away
 * from or closed without `close()` would lose the calls since. Both events are needed: a
 * write begun at `pagehide` is lost when the page is reloaded or navigated (Chromium aborts
 * the IndexedDB transactions of the document it unloads; `beforeunload` comes while the page
 * still runs), and `beforeunload` does not fire everywhere a tab is closed (mobile). Returns
 * the listeners' removal; `undefined` outside pages.
 */
function flushOnPageExit(core: CoreAgentHandle): (() => void) | undefined {
  if (!core.emergentEnabled || typeof document === 'undefined' || typeof globalThis.addEventListener !== 'function') return undefined;
  const flush = () => void core.flushStats().catch(() => undefined);
  const events = ['beforeunload', 'pagehide'];
  for (const event of events) globalThis.addEventListener(event, flush);
  return () => {
    for (const event of events) globalThis.removeEventListener(event, flush);
  };
}

/**
 * Ties an agent's core to the world outside it: the store's agents (`runtimes`), the shared
 * tier's channel, the page's `beforeunload` and `pagehide`. `release` lets go of all of it and of what the agent
 * owns, in this order: background work aborted (`background`, the signal its judge and host
 * tool calls get) and waited for, buffered stats written, the core freed (its registry writes
 * nothing more), direct operations still going aborted (`direct`), the sandbox stopped, and
 * only then the id released for a new agent. `close()`
 * calls it, and the finalizer of an agent dropped without `close()`. Made here rather than in
 * the constructor: a closure made there shares its scope with closures that use `this`, so it
 * would keep the agent alive and the finalizer holding it would never run.
 */
export function attach(
  core: CoreAgentHandle,
  store: Store | undefined,
  sandbox: SandboxHost | undefined,
  releaseRegistry: (() => void) | undefined,
  background: AbortController | undefined,
  direct: AbortController,
  waitingCalls: Set<(error: CrucibleError) => void>,
) {
  const channel = sharedTierChannel(store, core);
  const stopPageExitFlush = flushOnPageExit(core);
  if (store && core.emergentEnabled) {
    const agents = runtimes.get(store) ?? new Set<CoreAgentHandle>();
    agents.add(core);
    runtimes.set(store, agents);
  }
  const release = async (flushTimeoutMs = DEFAULT_CLOSE_FLUSH_TIMEOUT_MS): Promise<void> => {
    // The stats that could not be written are lost with the core: told to the caller of
    // close() once everything else is let go.
    let unflushed: unknown;
    try {
      if (store) runtimes.get(store)?.delete(core);
      channel?.close();
      stopPageExitFlush?.();
      if (core.emergentEnabled) {
        // An automatic promotion under review records nothing (its judge's request aborted
        // too); one whose panel approved commits, before the stats are written after it.
        core.stopBackground();
        background?.abort(new AbortError('the agent was closed'));
        const late = () => new StoreError('store_error', `close(): the store did not take the buffered tool stats within ${flushTimeoutMs} ms; they are not written`);
        const deadline = performance.now() + flushTimeoutMs;
        const written = core.settled().then(() => core.flushStats());
        await withinMs(written, flushTimeoutMs, late).catch((error: unknown) => (unflushed = error ?? new Error('the stats flush failed')));
        // An approval, demotion or rollback whose write is out lands before the agent id is
        // handed on: the next agent opened with it must read it, not have it land among its
        // records (where the same approval could be granted twice). Within the flush's time: a
        // store that never answers holds close() for `flushTimeoutMs` in all, not twice that.
        const stuck = () => new StoreError('store_error', `close(): a registry write the store had not finished within ${flushTimeoutMs} ms may still land`);
        await withinMs(core.closeWrites(), Math.max(0, deadline - performance.now()), stuck).catch((error: unknown) => (unflushed ??= error));
      }
    } finally {
      // Whatever failed above, the core and the agent id are let go. The core first: once
      // freed its registry writes nothing, and stopping the sandbox ends the executions of a
      // forge still in flight, which would then record its rejection.
      core.free();
      // Then the direct operations (forge, import, requestPromotion, a call with a signal)
      // still going: their judge's request or host tool stops, and, the core being freed,
      // they end as `closed` rather than waiting for an answer nobody will record.
      direct.abort(new AbortError('the agent was closed'));
      // And the tool calls made without a signal still waiting (for a host tool that may never
      // answer): the core holds their promise, not a signal it could abort.
      for (const reject of waitingCalls) reject(closedWhileCalling());
      waitingCalls.clear();
      try {
        await sandbox?.close?.();
      } finally {
        releaseRegistry?.();
      }
    }
    if (unflushed !== undefined) throw unflushed;
  };
  // For the finalizer: made here, for the reason above.
  const letGo = () => void release().catch(() => undefined);
  return { channel, release, letGo };
}

/** How long `close()` waits for the store to take the buffered stats (`flushTimeoutMs`). */
export const DEFAULT_CLOSE_FLUSH_TIMEOUT_MS = 10_000;

/** `promise`, or the error `late()` makes once `ms` pass first. */
function withinMs<T>(promise: Promise<T>, ms: number, late: () => Error): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(late()), ms);
  });
  return Promise.race([promise, deadline]).finally(() => clearTimeout(timer));
}

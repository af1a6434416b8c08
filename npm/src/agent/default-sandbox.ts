/** The sandbox an agent with emergent capabilities gets when it is given none, and how a
 *  sandbox is handed to the core of one agent among those sharing it. */
import { CrucibleError } from '../errors.js';
import type { EmergentOptions, SandboxHost } from './agent-options.js';
import { DEFAULT_MAX_CALLS_WAITING } from './waiting-calls.js';

/** `createSandbox`'s limits by the names `createAgent` takes them under. */
const AGENT_NAMES_OF_SANDBOX_LIMITS: ReadonlyMap<string, string> = new Map([
  ['timeoutMs', 'sandboxTimeoutMs'],
  ['memoryMB', 'sandboxMemoryMB'],
  ['idleTimeoutMs', 'sandboxIdleTimeoutMs'],
]);

/**
 * `sandbox` as the core of agent `agentId` reaches it: its JSON fast path (see
 * `createSandbox`) tags each execution with the agent, so agents sharing the sandbox take turns
 * and places by agent (see `WorkerPool.next`). A sandbox of one's own without the fast path is
 * handed over as it is.
 */
export function forAgent(sandbox: SandboxHost, agentId: string): SandboxHost {
  const executeJson: unknown = (sandbox as unknown as Record<symbol, unknown>)[EXECUTE_JSON];
  if (typeof executeJson !== 'function') return sandbox;
  const view: SandboxHost = { execute: (request, options) => sandbox.execute(request, options) };
  Object.defineProperty(view, EXECUTE_JSON, { value: (requestJson: string) => executeJson.call(sandbox, requestJson, agentId) });
  return view;
}

const EXECUTE_JSON = Symbol.for('crucible.sandbox.executeJson');

/** The default sandbox: a Worker pool with the agent's limits, loaded only when emergent
 * capabilities are enabled (a separate chunk for bundlers). Its Workers (about 28 MB each)
 * start with the first forged code that runs: many agents never run any. */
export async function defaultSandbox(em: EmergentOptions): Promise<SandboxHost> {
  const { createSandbox, sandboxLimits } = await import('../sandbox/index.js');
  const options = {
    timeoutMs: em.sandboxTimeoutMs,
    memoryMB: em.sandboxMemoryMB,
    idleTimeoutMs: em.sandboxIdleTimeoutMs,
    fetchDomainAllowlist: em.fetchDomainAllowlist,
    // As many executions wait as `tools.call`s may: with the sandbox's own 256, a burst of 400
    // calls of a forged tool saw 142 turned away.
    maxQueued: em.maxCallsWaiting ?? DEFAULT_MAX_CALLS_WAITING,
    lazy: true,
  };
  // A limit the sandbox refuses is a bad option of createAgent's, named as the caller wrote it.
  try {
    sandboxLimits(options);
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error);
    const named = message.replace(/^\w+/, (word) => AGENT_NAMES_OF_SANDBOX_LIMITS.get(word) ?? word);
    throw new CrucibleError('invalid_config', `createAgent: emergent.${named}`, { cause: error });
  }
  return createSandbox(options);
}

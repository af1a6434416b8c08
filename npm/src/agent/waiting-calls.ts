/** The `agent.tools.call`s of an agent that wait at once: their bound, and their error when
 *  `close()` cuts them off. */
import { CrucibleError } from '../errors.js';

/**
 * Most `agent.tools.call`s of one agent that may wait (on a host tool, or forged code) at once,
 * unless `emergent.maxCallsWaiting` says otherwise. A host tool that calls a forged tool back
 * after an `await`, when that tool reaches the host tool again, recursed without end: every
 * level waits on the next, and on microtasks alone the event loop never got a turn (no timer,
 * no abort fired) while memory grew until the process died. No platform tells which call an
 * `await`ed call is made inside, so the depth is bounded through what it makes: the calls
 * waiting.
 */
export const DEFAULT_MAX_CALLS_WAITING = 1024;

/** Throws `too_many_calls` when `max` calls wait already. */
export function refuseTooManyWaiting(waitingCalls: ReadonlySet<unknown>, max: number): void {
  if (waitingCalls.size < max) return;
  throw new CrucibleError(
    'too_many_calls',
    `tools.call: ${max} calls of this agent are waiting already (emergent.maxCallsWaiting; a host tool that calls back a forged tool reaching it again recurses without end; else make fewer calls at once, or raise it)`,
  );
}

/** The `closed` error of a `tools.call` that `close()` cut off (`cause`: how it failed then). */
export function closedWhileCalling(cause?: unknown): CrucibleError {
  return new CrucibleError('closed', 'tools.call: the agent was closed while the call ran (its sandbox and host tools are let go)', { cause });
}

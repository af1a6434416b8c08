/**
 * A run's events as this package types them (the core's, their error codes typed), and the
 * hub that routes them to run streams and `agent.on` listeners.
 */
import { isThenable, type CrucibleErrorCode } from '../errors.js';
import type { ErrorInfo as CoreErrorInfo, EventBody as CoreEventBody, ToolFailure as CoreToolFailure } from '../../wasm/crucible_core.js';

// The core's types say `code: string`: its codes are made in many places (some come from the
// host: a provider's, a store's), and this package's list of them is `CrucibleErrorCode`. The
// event types below are the core's with that list in place of `string`, so a `switch` on a
// code is checked; the core's codes are kept within it (unknown ones become `provider_protocol`,
// `store_error`, `execution_failed`).

/** A typed error as carried by events (`agent.error`): stable `code`, readable `message`, and
 *  for a provider's HTTP error its `status`. */
export type ErrorInfo = Omit<CoreErrorInfo, 'code'> & { code: CrucibleErrorCode };
/** Why a tool call produced an error result instead of output (`tool.execute.error`). The
 *  model sees `code` and `message`; the loop goes on. */
export type ToolFailure = Omit<CoreToolFailure, 'code'> & { code: CrucibleErrorCode };
/** What happened: the core's event, its error's `code` typed (see {@link ErrorInfo}). */
export type EventBody = CoreEventBody extends infer E
  ? E extends { type: 'agent.error' }
    ? Omit<E, 'error'> & { error: ErrorInfo }
    : E extends { type: 'tool.execute.error' }
      ? Omit<E, 'error'> & { error: ToolFailure }
      : E
  : never;
/** An event of a run, tagged by `type`; `runPath` lists the run ids from the outermost run to
 *  this one. */
export type AgentEvent = EventBody & { runId: string; runPath: string[] };

export type EventListener = (e: AgentEvent) => void;

/** Routes events: run events to their stream, registry events to the stream of the run that
 * caused them, and every event to `agent.on` listeners. */
export class EventHub {
  readonly listeners = new Set<EventListener>();
  readonly streams = new Map<string, EventListener>();

  dispatch = (event: AgentEvent): void => {
    this.streams.get(event.runId)?.(event);
    for (const listener of this.listeners) {
      try {
        // An async function is a listener too: its rejection is its own, like a throw, and
        // must not reach the process as an unhandled rejection (which ends a Node service).
        const returned: unknown = listener(event);
        if (isThenable(returned)) Promise.resolve(returned).catch(() => undefined);
      } catch {
        // A throwing listener must not break the run or other listeners.
      }
    }
  };

  /** Whether an event of `runId` would reach anyone (the core skips building the rest). */
  isObserved = (runId: string): boolean => this.listeners.size > 0 || this.streams.has(runId);
}

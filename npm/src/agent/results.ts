/**
 * What a run ends with: its result (completed or paused) collected from its events, or the
 * typed error of a run, or of a call, that failed.
 */
import type { PendingApproval, RunUsage } from '../../wasm/crucible_core.js';
import { AbortError, CrucibleError, StoreError, type CrucibleErrorCode } from '../errors.js';
import type { AgentEvent, EventBody } from './events.js';

/** What every {@link RunResult} carries. */
interface RunResultBase {
  runId: string;
  /** Tokens of every model call the run made: its own turns, and the forge judge's reviews of
   *  its model's `forge_tool` calls (under the judge's model id in `byModel`). */
  usage: RunUsage;
  turns: number;
  steps: number;
}

/** A run that ended with a final answer. */
export interface CompletedRun<Output = unknown> extends RunResultBase {
  status: 'completed';
  /** The parsed answer when `returns` is set, else the final text. */
  output: Output;
  text: string;
  pendingApprovals: [];
  /**
   * Why the answer ended, the same across providers: `length` is an answer cut off at the
   * token limit (`maxTokens`, or the server's), `content_filter` one the provider withheld.
   */
  finishReason: FinishReason;
}

/** Why an answer ended (`agent.end`'s `finishReason`, generated from the core). */
export type FinishReason = Extract<EventBody, { type: 'agent.end' }>['finishReason'];

/** A run that paused: tool calls wait for approval; continue with `agent.resume(run, { approvals })`. */
export interface PausedRun extends RunResultBase {
  status: 'paused';
  /** Calls waiting for a decision. */
  pendingApprovals: PendingApproval[];
  /** The resumable state: plain JSON, already persisted when the agent has a store. */
  state: unknown;
  output: undefined;
  text: '';
  finishReason: 'tool_calls';
}

/** A run that ended with a final answer or paused for approvals; tell them apart by `status`. */
export type RunResult<Output = unknown> = CompletedRun<Output> | PausedRun;

/** A run ended without a final answer: a limit, a model error or invalid structured output. */
export class AgentRunError extends CrucibleError {
  readonly runId: string;
  readonly usage: RunUsage | undefined;
  /** The HTTP status of a provider's error response (`provider_http`): 401, 429, 500… */
  readonly status: number | undefined;
  /** `cause`: for a provider's failure, the provider's own `ProviderError` (with `retryable`,
   *  `provider`, `body`), when it threw one. */
  constructor(code: CrucibleErrorCode, message: string, runId: string, usage?: RunUsage, status?: number, cause?: unknown) {
    super(code, message, cause !== undefined ? { cause } : undefined);
    this.name = 'AgentRunError';
    this.runId = runId;
    this.usage = usage;
    this.status = status;
  }
}

/** What travels beside a run's last event, which is plain JSON data: for an `agent.error`, the
 *  provider's own error (`collect` hands it on as `cause`); for an `agent.end`, the answer as a
 *  Standard Schema `returns` parsed it. */
export const besideEvents = new WeakMap<AgentEvent, unknown>();

/**
 * The result of a run from its events. With a Standard Schema `returns`, `output` is the answer
 * as the schema parsed it when the core checked it (see `checkOutput` in `createAgent`; it
 * travels beside `agent.end`): its defaults and transforms, which events, being plain JSON, do
 * not carry. An abort rejects with the signal's reason as its `cause` (a `TimeoutError` from
 * `AbortSignal.timeout`, or what the caller passed to `abort()`), so a deadline can be told
 * from a user's stop.
 */
export async function collect<Output>(events: AsyncIterable<AgentEvent>, signal?: AbortSignal): Promise<RunResult<Output>> {
  for await (const event of events) {
    switch (event.type) {
      case 'agent.end':
        return {
          runId: event.runId,
          status: 'completed',
          pendingApprovals: [],
          output: (besideEvents.has(event) ? besideEvents.get(event) : event.output) as Output,
          text: event.text,
          usage: event.usage,
          turns: event.turns,
          steps: event.steps,
          finishReason: event.finishReason,
        };
      case 'agent.paused': {
        const state = event.state as { turns?: number; steps?: number };
        return {
          runId: event.runId,
          status: 'paused',
          pendingApprovals: event.approvals,
          state: event.state,
          output: undefined,
          text: '',
          usage: event.usage,
          turns: state.turns ?? 0,
          steps: state.steps ?? 0,
          finishReason: 'tool_calls',
        };
      }
      case 'agent.error':
        if (event.error.code === 'aborted') {
          throw new AbortError(event.error.message, { runId: event.runId, usage: event.usage, cause: signal?.aborted ? signal.reason : undefined });
        }
        throw new AgentRunError(event.error.code, event.error.message, event.runId, event.usage, event.error.status, besideEvents.get(event));
      default:
        break;
    }
  }
  throw new CrucibleError('internal', 'the run ended without a final event');
}

/** `f()`, its failure (thrown or rejected) as a typed error. */
export async function wrapAsync<T>(f: () => Promise<T>, runId = ''): Promise<T> {
  try {
    return await f();
  } catch (error) {
    throw toCrucibleError(error, runId);
  }
}

export function toCrucibleError(error: unknown, runId: string): CrucibleError {
  if (error instanceof CrucibleError) return error;
  const e = error as { code?: string; message?: string };
  if (e?.code === 'aborted') return new AbortError(e.message, { runId: runId || undefined });
  // A store failure outside a run is a StoreError (a registry write, a run's claim). A run that
  // fails on its store ends with an AgentRunError of the store's code (see `collect`), which
  // names the run to resume.
  if (typeof e?.code === 'string' && e.code.startsWith('store_')) {
    return new StoreError(e.code as Extract<CrucibleErrorCode, `store_${string}`>, e.message ?? String(error));
  }
  return new AgentRunError((e?.code as CrucibleErrorCode) ?? 'internal', e?.message ?? String(error), runId);
}

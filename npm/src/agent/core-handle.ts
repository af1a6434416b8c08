/** The wasm core's agent (`core.CoreAgent.create`'s handle) as the `Agent` drives it. */
import type { PendingApproval, StoredRun } from '../../wasm/crucible_core.js';
import type { AuditEntry, ForgeResult, ForgeStats, ForgeTestCase, PromotionOutcome, ToolInfo } from '../emergent/types.js';
import type { EventListener } from './events.js';
import type { ApprovalDecision } from './method-options.js';

export interface CoreAgentHandle {
  readonly emergentEnabled: boolean;
  /** `callsRunId`: the run id its judge and its tests' host tools get (see `Agent.#direct`). */
  forge(request: unknown, sessionId: string, scope: string | undefined, signal: AbortSignal | undefined, callsRunId: string): Promise<ForgeResult>;
  /** `argsJson`: the arguments' JSON text (`undefined` reads as null). The result's JSON text
   *  when the call finished at once (see {@link valueOf}), else a promise of the result. */
  callTool(name: string, argsJson: string | undefined, sessionId: string, signal: AbortSignal | undefined, runId: string | undefined): string | Promise<unknown>;
  listTools(sessionId: string): ToolInfo[];
  forgeStats(): ForgeStats;
  /** `callsRunId`: the run id its judge and its tests' host tools get (see `Agent.#direct`). */
  requestPromotion(name: string, tier: string, sessionId: string, signal: AbortSignal | undefined, callsRunId: string): Promise<PromotionOutcome>;
  approve(id: string): Promise<ToolInfo>;
  deny(id: string, reason: string): Promise<void>;
  demote(name: string, sessionId: string): Promise<ToolInfo>;
  rollback(name: string, version: number, sessionId: string): Promise<ToolInfo>;
  exportTool(name: string, sessionId: string): string;
  /** `callsRunId`: the run id its judge and its tests' host tools get (see `Agent.#direct`). */
  importTool(pkg: string, sessionId: string, options: { testCases?: ForgeTestCase[] }, signal: AbortSignal | undefined, callsRunId: string): Promise<ForgeResult>;
  pendingApprovals(): PendingApproval[];
  audit(): AuditEntry[];
  flushStats(): Promise<void>;
  /** Resolves once no background work (an automatic promotion) is in flight. */
  settled(): Promise<void>;
  /** Aborts the background work in flight (recording nothing) and starts none after. */
  stopBackground(): void;
  /** Stops the registry's store writes; resolves once those already out have ended. */
  closeWrites(): Promise<void>;
  reloadShared(): Promise<void>;
  run(input: string, runId: string, sessionId: string | undefined, scope: string | undefined, onEvent: EventListener, signal?: AbortSignal): Promise<unknown>;
  resume(runId: string, state: unknown, decisions: ApprovalDecision[] | undefined, onEvent: EventListener, signal?: AbortSignal): Promise<unknown>;
  history(sessionId: string): unknown;
  endSession(sessionId: string): Promise<void>;
  storedRuns(): Promise<StoredRun[]>;
  discardRun(runId: string): Promise<boolean>;
  toolNames(): string[];
  free(): void;
}

/**
 * crucible-agents: the API shared by every platform. Import the package itself
 * (`import { createAgent } from 'crucible-agents'`); the `node` / `browser` entry points
 * re-export this and register how the wasm is loaded there.
 */
export { createAgent, Agent, AgentRunError } from './agent.js';
export type { CallOptions, EmergentOptions, ForgeOptions, ImportOptions, JudgeOptions, PromotionOptions, SandboxHost, SessionOptions } from './agent.js';
export type * from './emergent/types.js';
export type { AgentOptions, SessionHistoryOptions, CloseOptions, RunOptions, RunResult, CompletedRun, PausedRun, FinishReason, ResumeOptions, ApprovalDecision, AgentEvent, EventBody, RunUsage, Usage, ErrorInfo, ToolFailure, PendingApproval, StoredRun, Value } from './agent.js';
export { tool, toJsonSchema } from './tool.js';
export { createSandbox, checkUrl, FetchRefused } from './sandbox/index.js';
export type { ExecuteOptions, Sandbox, SandboxOptions, SandboxRequest, SandboxResult, SandboxStatus, SandboxStats } from './sandbox/index.js';
export type { HostTool, ToolOptions, ToolExecuteContext, JsonSchema, StandardJsonSchemaLike } from './tool.js';
export { openai, anthropic, ollama } from './providers/index.js';
export type * from './providers/types.js';
export { CrucibleError, ProviderError, StoreError, AbortError, SandboxError } from './errors.js';
export type { CrucibleErrorCode } from './errors.js';

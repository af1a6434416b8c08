/** Messages between the sandbox host and its Worker. Only plain data and JSON strings. */

export interface InitMessage {
  type: 'init';
  module: WebAssembly.Module;
  memoryMB: number;
  /** JSON of the runner limits (camelCase, see src/wasm/sandbox.rs `InitLimits`). */
  limits: string;
}

export interface ExecuteMessage {
  type: 'execute';
  id: number;
  /** SandboxRequest JSON. */
  request: string;
}

export interface FetchResultMessage {
  type: 'fetch-result';
  id: number;
  ok: boolean;
  /** FetchResponse JSON when ok, else a plain message. */
  payload: string;
}

export type HostToWorker = InitMessage | ExecuteMessage | FetchResultMessage;

export type WorkerToHost =
  | { type: 'ready' }
  | { type: 'init-error'; message: string }
  /** `memoryBytes`: the instance's memory after the execution (wasm memory never shrinks). */
  | { type: 'result'; id: number; result: string; memoryBytes: number }
  | { type: 'trap'; id: number | undefined; message: string; allocationFailed: boolean; memoryBytes: number }
  | { type: 'fetch'; id: number; request: string };

/**
 * Host tools written in TypeScript: `tool({ name, description, inputSchema, execute })`.
 * `inputSchema` is JSON Schema, or a Standard Schema object that can give JSON Schema
 * (Zod 4 and others implementing `~standard.jsonSchema`, or a `toJSONSchema()` method).
 */
import { CrucibleError } from './errors.js';

/** A JSON Schema object. */
export type JsonSchema = Record<string, unknown>;

/** A schema object implementing Standard JSON Schema (e.g. Zod 4). */
export interface StandardJsonSchemaLike {
  '~standard': {
    version: number;
    vendor: string;
    jsonSchema?: { input: (options: { target: string }) => JsonSchema };
  };
  toJSONSchema?: () => JsonSchema;
}

/** What a tool's `execute` receives besides its arguments. */
export interface ToolExecuteContext {
  /** Aborted when the run is aborted. */
  signal: AbortSignal;
  runId: string;
  callId: string;
  sessionId: string;
}

/** Options of {@link tool}. */
export interface ToolOptions<Args = any, Result = unknown> {
  /** Identifier the model calls: `^[A-Za-z0-9_-]{1,64}$`. */
  name: string;
  description: string;
  inputSchema: JsonSchema | StandardJsonSchemaLike;
  /** When given, every result is validated against it (an invalid result is an error result). */
  outputSchema?: JsonSchema | StandardJsonSchemaLike;
  execute: (args: Args, context: ToolExecuteContext) => Result | Promise<Result>;
  /**
   * Calls wait for a human decision before executing: the run pauses (`status: 'paused'`)
   * and continues with `agent.resume()`. A predicate decides per call; if it throws, the call
   * waits for approval (fail closed).
   */
  needsApproval?: boolean | ((args: Args) => boolean | Promise<boolean>);
}

/** A host tool, ready to pass to `createAgent({ tools })`. */
export interface HostTool<Args = any, Result = unknown> {
  readonly kind: 'host';
  readonly name: string;
  readonly description: string;
  readonly inputSchema: JsonSchema;
  readonly outputSchema: JsonSchema | undefined;
  readonly execute: (args: Args, context: ToolExecuteContext) => Result | Promise<Result>;
  readonly needsApproval: boolean | ((args: Args) => boolean | Promise<boolean>);
}

/** Resolves JSON Schema from a plain schema or a Standard Schema object. */
export function toJsonSchema(schema: JsonSchema | StandardJsonSchemaLike, where: string): JsonSchema {
  const standard = (schema as StandardJsonSchemaLike)['~standard'];
  if (standard && typeof standard === 'object') {
    if (standard.jsonSchema && typeof standard.jsonSchema.input === 'function') {
      return stripMeta(standard.jsonSchema.input({ target: 'draft-2020-12' }));
    }
    if (typeof (schema as StandardJsonSchemaLike).toJSONSchema === 'function') {
      return stripMeta((schema as StandardJsonSchemaLike).toJSONSchema!());
    }
    throw new CrucibleError('invalid_config', `${where}: this Standard Schema (${standard.vendor}) cannot produce JSON Schema`);
  }
  if (schema === null || typeof schema !== 'object' || Array.isArray(schema)) {
    throw new CrucibleError('invalid_config', `${where} must be a JSON Schema object`);
  }
  return schema as JsonSchema;
}

// `$schema` URIs are fine for jsonschema but some providers reject unknown keys in tools.
function stripMeta(schema: JsonSchema): JsonSchema {
  const { $schema: _ignored, ...rest } = schema;
  return rest;
}

/** Defines a host tool. */
export function tool<Args = any, Result = unknown>(options: ToolOptions<Args, Result>): HostTool<Args, Result> {
  if (typeof options.execute !== 'function') {
    throw new CrucibleError('invalid_config', `tool ${options.name}: execute must be a function`);
  }
  return Object.freeze({
    kind: 'host' as const,
    name: options.name,
    description: options.description ?? '',
    inputSchema: toJsonSchema(options.inputSchema, `tool ${options.name}: inputSchema`),
    outputSchema: options.outputSchema ? toJsonSchema(options.outputSchema, `tool ${options.name}: outputSchema`) : undefined,
    execute: options.execute,
    needsApproval: options.needsApproval ?? false,
  });
}

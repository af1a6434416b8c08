/**
 * Host tools written in TypeScript: `tool({ name, description, inputSchema, execute })`.
 * `inputSchema` is JSON Schema, or a Standard Schema object that can give JSON Schema
 * (Zod 4 and others implementing `~standard.jsonSchema`, or a `toJSONSchema()` method).
 */
import { CrucibleError, describeType, isRecord } from './errors.js';

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
  /** Aborted when the run is aborted (or the direct `agent.forge` / `agent.tools.call` that
   *  reached this tool, when it was given a signal). */
  signal: AbortSignal;
  /** The run's id; `direct_…` in a direct forge or call given a signal, `''` in one without. */
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
  if (!isRecord(schema)) {
    throw new CrucibleError('invalid_config', `${where} must be a JSON Schema object`);
  }
  return schema as JsonSchema;
}

// `$schema` URIs are fine for jsonschema but some providers reject unknown keys in tools.
function stripMeta(schema: JsonSchema): JsonSchema {
  const { $schema: _ignored, ...rest } = schema;
  return rest;
}

/** Names a tool may have: what OpenAI, Anthropic and the core all accept. */
const TOOL_NAME = /^[A-Za-z0-9_-]{1,64}$/;

/** `toJsonSchema`, with any failure (a vendor's converter throwing too) as `invalid_config`. */
function resolveSchema(schema: JsonSchema | StandardJsonSchemaLike, where: string): JsonSchema {
  try {
    return toJsonSchema(schema, where);
  } catch (cause) {
    if (cause instanceof CrucibleError) throw cause;
    const detail = cause instanceof Error ? cause.message : String(cause);
    throw new CrucibleError('invalid_config', `${where} cannot be turned into JSON Schema: ${detail}`, { cause });
  }
}

/** A JSON Schema object, or a Standard Schema (some vendors', ArkType's, are callable). */
function isSchemaLike(value: unknown): boolean {
  return isRecord(value) || (typeof value === 'function' && '~standard' in value);
}

/** Defines a host tool. Throws `invalid_config` when the options cannot make one. */
export function tool<Args = any, Result = unknown>(options: ToolOptions<Args, Result>): HostTool<Args, Result> {
  if (!isRecord(options)) {
    throw new CrucibleError('invalid_config', 'tool() needs an options object: tool({ name, description, inputSchema, execute })');
  }
  const { name } = options;
  const label = typeof name === 'string' && name !== '' ? `tool ${JSON.stringify(name)}` : 'tool()';
  if (typeof name !== 'string' || !TOOL_NAME.test(name)) {
    const got = typeof name === 'string' ? JSON.stringify(name) : describeType(name);
    throw new CrucibleError('invalid_config', `${label}: name must match ^[A-Za-z0-9_-]{1,64}$ (got ${got})`);
  }
  if (typeof options.execute !== 'function') {
    throw new CrucibleError('invalid_config', `${label}: execute must be a function (got ${describeType(options.execute)})`);
  }
  if (!isSchemaLike(options.inputSchema)) {
    throw new CrucibleError('invalid_config', `${label}: inputSchema must be a JSON Schema object or a Standard Schema (got ${describeType(options.inputSchema)})`);
  }
  const { outputSchema } = options;
  if (outputSchema != null && !isSchemaLike(outputSchema)) {
    throw new CrucibleError('invalid_config', `${label}: outputSchema must be a JSON Schema object or a Standard Schema (got ${describeType(outputSchema)})`);
  }
  if (options.description !== undefined && typeof options.description !== 'string') {
    throw new CrucibleError('invalid_config', `${label}: description must be a string (got ${describeType(options.description)})`);
  }
  const { needsApproval } = options;
  if (!isApprovalRule(needsApproval)) {
    throw new CrucibleError('invalid_config', `${label}: needsApproval must be a boolean or a function (got ${describeType(needsApproval)})`);
  }
  return Object.freeze({
    kind: 'host' as const,
    name,
    description: options.description ?? '',
    inputSchema: resolveSchema(options.inputSchema, `${label}: inputSchema`),
    outputSchema: outputSchema != null ? resolveSchema(outputSchema, `${label}: outputSchema`) : undefined,
    execute: options.execute,
    needsApproval: needsApproval ?? false,
  });
}

/** Whether `value` is a usable `needsApproval`: absent, a boolean, or a predicate. Anything else
 * would silently mean "never ask", so it is refused (fail closed). */
export function isApprovalRule(value: unknown): boolean {
  return value === undefined || typeof value === 'boolean' || typeof value === 'function';
}
